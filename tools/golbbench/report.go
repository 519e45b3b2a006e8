package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"
)

// Result is the one JSON line a subcommand prints.
type Result struct {
	Test       string   `json:"test"`
	Messages   int      `json:"messages"`
	Bytes      int64    `json:"bytes"`
	Seconds    float64  `json:"seconds"`
	ClientCPU  float64  `json:"client_cpu"`
	ServerCPU  float64  `json:"server_cpu"`
	Errors     int      `json:"errors"`
	FirstError string   `json:"first_error,omitempty"`
	P50us      *float64 `json:"p50_us,omitempty"`
	P99us      *float64 `json:"p99_us,omitempty"`
	MaxUs      *float64 `json:"max_us,omitempty"`
}

// Print writes the result as one JSON line on stdout.
func (r *Result) Print() {
	line, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot encode the result:", err)
		return
	}
	fmt.Println(string(line))
}

// SetLatencies records p50, p99 and max of per-message latencies, in microseconds.
func (r *Result) SetLatencies(latencies []time.Duration) {
	if len(latencies) < 2 {
		return
	}
	sorted := make([]float64, len(latencies))
	for i, d := range latencies {
		sorted[i] = float64(d.Nanoseconds()) / 1e3
	}
	sort.Float64s(sorted)
	p50, p99, max := quantile(sorted, 50), quantile(sorted, 99), sorted[len(sorted)-1]
	r.P50us, r.P99us, r.MaxUs = &p50, &p99, &max
}

// quantile is the i-th percentile of sorted data by Python's statistics.quantiles(n=100,
// method="inclusive"), so the Go and Python latencies are computed the same way (and never
// above the maximum, unlike the "exclusive" default on few samples).
func quantile(sorted []float64, i int) float64 {
	const n = 100
	m := len(sorted) - 1
	j := i * m / n
	delta := float64(i*m - j*n)
	if j+1 >= len(sorted) {
		return sorted[m]
	}
	return (sorted[j]*(n-delta) + sorted[j+1]*delta) / n
}
