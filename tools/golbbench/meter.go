package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on every Linux platform Go supports).
const clockTicks = 100

// Meter measures wall-clock seconds, this process's CPU seconds and the server's CPU seconds.
type Meter struct {
	serverPID int
	wall      time.Time
	cpu       float64
	server    float64
}

func processCPU() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	seconds := func(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }
	return seconds(usage.Utime) + seconds(usage.Stime)
}

// serverCPU returns user + system CPU seconds of a process from /proc/<pid>/stat (0 if unknown).
func serverCPU(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	text := string(data)
	fields := strings.Fields(text[strings.LastIndexByte(text, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / clockTicks
}

func startMeter(serverPID int) *Meter {
	m := &Meter{serverPID: serverPID, cpu: processCPU(), server: serverCPU(serverPID)}
	m.wall = time.Now()
	return m
}

// Stop fills the result's seconds and CPU seconds.
func (m *Meter) Stop(result *Result) {
	result.Seconds = time.Since(m.wall).Seconds()
	result.ClientCPU = processCPU() - m.cpu
	result.ServerCPU = serverCPU(m.serverPID) - m.server
}
