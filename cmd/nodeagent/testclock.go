package main

import (
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// testClockEnv names, with NODEAGENT_TEST_HOOKS=1, a file holding a
// duration by which the PIA providers' wall clock runs from the system's
// (a clock step, "+25h" or "-10m"); the daemon reads it at start and at
// each SIGUSR1. The soak steps the daemon's clock this way: stepping the
// machine's own would step every other test on it.
const testClockEnv = "NODEAGENT_TEST_CLOCK"

// testClock returns the stepped wall clock that testClockEnv asks for, or
// nil. Its readings carry no monotonic clock, as a stepped wall clock's
// would not: intervals stay on the providers' monotonic clock.
func testClock() func() time.Time {
	path := os.Getenv(testClockEnv)
	if path == "" {
		return nil
	}
	var offset atomic.Int64
	read := func() {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil {
			offset.Store(int64(d))
		}
	}
	read()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for range sig {
			read()
		}
	}()
	return func() time.Time { return time.Now().Round(0).Add(time.Duration(offset.Load())) }
}
