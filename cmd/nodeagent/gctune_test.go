package main

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestGCPercentFor: a small live heap keeps the daemon's 50 %; a large
// one (an embedded WireGuard device with thousands of peers) grows by
// gcHeadroom at most, and by no less than 10 %.
func TestGCPercentFor(t *testing.T) {
	const MiB = 1 << 20
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 50},
		{10 * MiB, 50},
		{48 * MiB, 50},
		{96 * MiB, 25},
		{185 * MiB, 12},
		{1024 * MiB, 10},
	} {
		if got := gcPercentFor(c.live); got != c.want {
			t.Errorf("gcPercentFor(%d MiB) = %d; want %d", c.live/MiB, got, c.want)
		}
	}
}

// TestTuneGC: once armed, the tuner sets the target after collections
// from the heap left live (three of them: it re-arms itself). The tuner
// then stays on for the rest of the package's tests, as in the daemon.
func TestTuneGC(t *testing.T) {
	old := debug.SetGCPercent(daemonGCPercent)
	defer debug.SetGCPercent(old)
	tuneGC()
	// Keep 200 MiB live: the target must fall to 24 MiB of it and what
	// else the test binary holds, 11-12 %.
	keep := make([][]byte, 200)
	for i := range keep {
		keep[i] = make([]byte, 1<<20)
	}
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(50 * time.Millisecond) // the finalizer runs on its own goroutine
	}
	if got := debug.SetGCPercent(old); got < 11 || got > 12 {
		t.Errorf("GC percent with 200 MiB live: %d; want 11 or 12", got)
	}
	debug.SetGCPercent(daemonGCPercent)
	runtime.KeepAlive(keep)
}
