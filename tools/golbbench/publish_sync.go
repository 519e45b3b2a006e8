package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

// ackDeadline bounds the wait for one synchronous publish's ack.
const ackDeadline = 30 * time.Second

// publishSync calls Publish once per message, each waiting for its ack, recording every latency.
func publishSync(args []string) (*Result, error) {
	var common Common
	flags := newFlags("publish-sync", &common)
	messages := flags.Int("messages", 3000, "messages to publish")
	size := flags.Int("size", 256, "value size in bytes")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	if err := common.check(); err != nil {
		return nil, err
	}
	if *messages < 2 || *size < 0 {
		return nil, errors.New("--messages must be >= 2, --size >= 0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), common.Timeout)
	defer cancel()
	client, err := common.connect(ctx, 0)
	if err != nil {
		return nil, err
	}
	defer client.Close()

	value := randomValue(*size)
	result := &Result{Test: "publish-sync", Messages: *messages, Bytes: int64(*messages) * int64(*size)}
	latencies := make([]time.Duration, *messages)
	meter := startMeter(common.ServerPID)
	for i := range latencies {
		sent := time.Now()
		ackCtx, done := context.WithTimeout(ctx, ackDeadline) // a deadline: Publish waits for the ack
		ack, err := client.Publish(ackCtx, common.Stream, value, lift.ToPartition(0), lift.AckPolicyLeader())
		done()
		latencies[i] = time.Since(sent)
		if err == nil && ack == nil {
			err = errors.New("no ack")
		}
		if err == nil && ack.Offset() != int64(i) {
			err = fmt.Errorf("ack offset %d, expected %d", ack.Offset(), i)
		}
		if err != nil {
			result.Messages = i
			result.Errors = 1
			result.FirstError = err.Error()
			meter.Stop(result)
			return result, fmt.Errorf("message %d: %w", i, err)
		}
	}
	meter.Stop(result)
	result.SetLatencies(latencies)
	return result, nil
}
