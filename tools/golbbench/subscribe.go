package main

import (
	"context"
	"errors"
	"fmt"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

// subscribe reads one partition from its earliest offset and times Subscribe to the --count-th message.
func subscribe(args []string) (*Result, error) {
	var common Common
	flags := newFlags("subscribe", &common)
	partition := flags.Int("partition", 0, "partition to read")
	count := flags.Int("count", 100000, "messages to read (offsets from the earliest on)")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	if err := common.check(); err != nil {
		return nil, err
	}
	if *count < 1 || *partition < 0 {
		return nil, errors.New("--count must be >= 1, --partition >= 0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), common.Timeout)
	defer cancel()
	client, err := common.connect(ctx, int32(*partition))
	if err != nil {
		return nil, err
	}
	defer client.Close()

	result := &Result{Test: "subscribe"}
	var (
		done           = make(chan struct{})
		first    int64 = -1
		problem  error
		received int
	)
	// The handler runs on one goroutine, message after message; done is closed once.
	handler := func(msg *lift.Message, err error) {
		if received == *count || problem != nil {
			return
		}
		switch {
		case err != nil:
			problem = err
		case first < 0:
			first = msg.Offset()
		case msg.Offset() != first+int64(received):
			problem = fmt.Errorf("offset %d after %d messages from %d", msg.Offset(), received, first)
		}
		if problem == nil {
			received++
			result.Bytes += int64(len(msg.Value()))
		}
		if problem != nil || received == *count {
			close(done)
		}
	}
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	meter := startMeter(common.ServerPID)
	err = client.Subscribe(subCtx, common.Stream, handler, lift.Partition(int32(*partition)), lift.StartAtEarliestReceived())
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		stop()
		return nil, fmt.Errorf("time limit: %w", ctx.Err())
	}
	meter.Stop(result)
	stop()
	result.Messages = received
	if problem != nil {
		result.Errors = 1
		result.FirstError = problem.Error()
		return result, fmt.Errorf("after %d messages: %w", received, problem)
	}
	return result, nil
}
