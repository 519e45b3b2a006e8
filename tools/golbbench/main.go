// Command golbbench runs go-liftbridge, the reference Go client, against a running Liftbridge server:
// bench/bench_client.py and bench/bench_spark.py measure it next to the Python client, and the consumer
// group interop tests run its group subcommand as a member next to Python members.
//
//	golbbench publish-async --brokers host:port --stream S --messages N --size B --window W
//	golbbench publish-sync  --brokers host:port --stream S --messages N --size B
//	golbbench subscribe     --brokers host:port --stream S --partition P --count N
//	golbbench group         --brokers host:port --stream S --group G [--checkpoint D] (see group.go)
//
// Every subcommand prints one JSON line on stdout (see report.go) and exits 1 when a result is
// wrong (a failed or missing ack, a missing or out-of-order message) or the time limit passed.
// Installed into .tools/bin by `make golbbench` (tools/install-golbbench.sh).
package main

import (
	"fmt"
	"os"
)

var commands = map[string]func(args []string) (*Result, error){
	"publish-async": publishAsync,
	"publish-sync":  publishSync,
	"subscribe":     subscribe,
	"group":         group,
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: golbbench publish-async|publish-sync|subscribe|group [flags] (golbbench <command> -h lists them)")
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	command, ok := commands[os.Args[1]]
	if !ok {
		usage()
		os.Exit(2)
	}
	result, err := command(os.Args[2:])
	if result != nil {
		result.Print()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "golbbench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
