//go:build tools

// Package tools records the S3 gateway this project installs, so that go.mod and go.sum pin its version
// and checksums.
package tools

import (
	_ "github.com/versity/versitygw/cmd/versitygw"
)
