package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestTestClock: the soak's clock step. The step in the file at start,
// another after SIGUSR1; readings carry no monotonic clock; without the
// variable there is no test clock.
func TestTestClock(t *testing.T) {
	t.Setenv(testClockEnv, "")
	if testClock() != nil {
		t.Fatal("a test clock without " + testClockEnv)
	}
	file := filepath.Join(t.TempDir(), "step")
	os.WriteFile(file, []byte("25h\n"), 0o644)
	t.Setenv(testClockEnv, file)
	now := testClock()
	near := func(want time.Duration) bool {
		d := now().Sub(time.Now().Round(0)) - want
		return d > -time.Second && d < time.Second
	}
	if !near(25 * time.Hour) {
		t.Fatalf("at start: %s, want 25h ahead", now())
	}
	if r := now(); r != r.Round(0) {
		t.Error("a reading carries the monotonic clock")
	}
	os.WriteFile(file, []byte("-10m\n"), 0o644)
	syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	deadline := time.Now().Add(5 * time.Second)
	for !near(-10*time.Minute) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !near(-10 * time.Minute) {
		t.Fatalf("after SIGUSR1: %s, want 10m behind", now())
	}
}
