package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	lift "github.com/liftbridge-io/go-liftbridge/v2"
)

// group runs one member of a consumer group (go-liftbridge's CreateConsumer), for the interop tests of
// tests/server/test_consumer_groups.py. It prints "subscribed" once it joined, then
// "message <partition> <offset>" for every message its handler got, until SIGTERM or --timeout;
// then it checkpoints and closes (leaves the group). SIGKILL stops it without either. SIGUSR1
// checkpoints at once (then prints "checkpointed"); --checkpoint 0 turns automatic checkpoints off.
func group(args []string) (*Result, error) {
	var common Common
	flags := newFlags("group", &common)
	groupID := flags.String("group", "", "consumer group id")
	consumerID := flags.String("consumer-id", "", "member id (default: a random one)")
	autoOffset := flags.String("auto-offset", "earliest", "earliest, latest or none")
	checkpoint := flags.Duration("checkpoint", time.Second, "auto checkpoint interval (0: none)")
	fetch := flags.Duration("fetch-interval", 500*time.Millisecond, "assignment fetch interval")
	if err := flags.Parse(args); err != nil {
		return nil, err
	}
	if err := common.check(); err != nil {
		return nil, err
	}
	options := []lift.ConsumerOption{
		lift.AutoCheckpoint(*checkpoint),
		lift.FetchAssignmentsInterval(func(time.Duration) time.Duration { return *fetch }),
	}
	switch *autoOffset {
	case "earliest":
		options = append(options, lift.AutoOffsetEarliest())
	case "latest":
		options = append(options, lift.AutoOffsetLatest())
	case "none":
		options = append(options, lift.AutoOffsetNone())
	default:
		return nil, fmt.Errorf("--auto-offset must be earliest, latest or none, got %q", *autoOffset)
	}
	if *groupID == "" {
		return nil, errors.New("--group is required")
	}
	if *consumerID != "" {
		options = append(options, lift.ConsumerID(*consumerID))
	}
	client, err := lift.Connect(strings.Split(common.Brokers, ","))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", common.Brokers, err)
	}
	defer client.Close()
	consumer, err := client.CreateConsumer(*groupID, options...)
	if err != nil {
		return nil, fmt.Errorf("create consumer: %w", err)
	}

	result := &Result{Test: "group"}
	var mu sync.Mutex // the handler runs on one goroutine per partition
	handler := func(msg *lift.Message, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			result.Errors++
			if result.FirstError == "" {
				result.FirstError = err.Error()
			}
			return
		}
		fmt.Printf("message %d %d\n", msg.Partition(), msg.Offset())
		result.Messages++
	}
	ctx, cancel := context.WithTimeout(context.Background(), common.Timeout)
	defer cancel()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	if err := consumer.Subscribe(ctx, []string{common.Stream}, handler); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	fmt.Println("subscribed")
	now := make(chan os.Signal, 1)
	signal.Notify(now, syscall.SIGUSR1)
	for waiting := true; waiting; {
		select {
		case <-now:
			if err := consumer.Checkpoint(ctx); err != nil {
				return nil, fmt.Errorf("checkpoint: %w", err)
			}
			fmt.Println("checkpointed")
		case <-stop:
			waiting = false
		case <-ctx.Done():
			waiting = false
		}
	}
	last, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	if err := consumer.Checkpoint(last); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if err := consumer.Close(); err != nil {
		return nil, fmt.Errorf("close: %w", err)
	}
	return result, nil
}
