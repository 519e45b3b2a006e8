package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

// Common holds the flags every subcommand takes.
type Common struct {
	Brokers   string
	Stream    string
	ServerPID int
	Timeout   time.Duration
}

func newFlags(name string, common *Common) *flag.FlagSet {
	flags := flag.NewFlagSet(name, flag.ContinueOnError)
	flags.StringVar(&common.Brokers, "brokers", "127.0.0.1:9292", "comma-separated Liftbridge gRPC addresses")
	flags.StringVar(&common.Stream, "stream", "", "stream name (must exist)")
	flags.IntVar(&common.ServerPID, "server-pid", 0, "server process whose CPU seconds are reported (0: none)")
	flags.DurationVar(&common.Timeout, "timeout", 10*time.Minute, "time limit of the whole run")
	return flags
}

func (c *Common) check() error {
	if c.Stream == "" {
		return errors.New("--stream is required")
	}
	if c.Timeout <= 0 {
		return errors.New("--timeout must be > 0")
	}
	return nil
}

// connect opens a client and learns the stream's partition leader, outside any timed section.
func (c *Common) connect(ctx context.Context, partition int32) (lift.Client, error) {
	client, err := lift.Connect(strings.Split(c.Brokers, ","), lift.AckWaitTime(30*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.Brokers, err)
	}
	if _, err := client.FetchMetadata(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("fetch metadata: %w", err)
	}
	if _, err := client.FetchPartitionMetadata(ctx, c.Stream, partition); err != nil {
		client.Close()
		return nil, fmt.Errorf("partition %d of %s: %w", partition, c.Stream, err)
	}
	return client, nil
}

func randomValue(size int) []byte {
	value := make([]byte, size)
	if f, err := os.Open("/dev/urandom"); err == nil {
		defer f.Close()
		_, _ = f.Read(value)
	}
	return value
}
