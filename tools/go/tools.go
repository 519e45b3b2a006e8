//go:build tools

// Package tools records the server binaries this project installs, so that
// go.mod and go.sum pin their versions and checksums.
package tools

import (
	_ "github.com/liftbridge-io/liftbridge"
	_ "github.com/nats-io/nats-server/v2"
)
