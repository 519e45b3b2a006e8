package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

// publishAsync sends --messages values with PublishAsync, at most --window awaiting their ack,
// and times the first send to the last ack.
func publishAsync(args []string) (*Result, error) {
	var common Common
	flags := newFlags("publish-async", &common)
	messages := flags.Int("messages", 100000, "messages to publish")
	size := flags.Int("size", 256, "value size in bytes")
	window := flags.Int("window", 1024, "acks outstanding at most")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	if err := common.check(); err != nil {
		return nil, err
	}
	if *messages < 1 || *size < 0 || *window < 1 {
		return nil, errors.New("--messages and --window must be >= 1, --size >= 0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), common.Timeout)
	defer cancel()
	client, err := common.connect(ctx, 0)
	if err != nil {
		return nil, err
	}
	defer client.Close()

	value := randomValue(*size)
	result := &Result{Test: "publish-async", Messages: *messages, Bytes: int64(*messages) * int64(*size)}
	var (
		slots = make(chan struct{}, *window)
		acks  sync.WaitGroup
		mu    sync.Mutex
	)
	failed := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		result.Errors++
		if result.FirstError == "" {
			result.FirstError = err.Error()
		}
	}
	handler := func(ack *lift.Ack, err error) {
		if err == nil && ack == nil {
			err = errors.New("no ack")
		}
		if err != nil {
			failed(err)
		}
		<-slots
		acks.Done()
	}
	meter := startMeter(common.ServerPID)
	for i := 0; i < *messages; i++ {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return result, fmt.Errorf("time limit after %d sends: %w", i, ctx.Err())
		}
		acks.Add(1)
		err := client.PublishAsync(ctx, common.Stream, value, handler, lift.ToPartition(0), lift.AckPolicyLeader())
		if err != nil { // not sent: its handler is never called
			failed(err)
			<-slots
			acks.Done()
		}
	}
	acks.Wait()
	meter.Stop(result)
	if result.Errors > 0 {
		return result, fmt.Errorf("%d of %d messages failed, first: %s", result.Errors, *messages, result.FirstError)
	}
	return result, nil
}
