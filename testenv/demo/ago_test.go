package main

import (
	"strconv"
	"testing"
	"time"
)

// The demo shows a handshake as its age, not as wg(8)'s epoch seconds.
func TestAgo(t *testing.T) {
	five := strconv.FormatInt(time.Now().Add(-5*time.Second).Unix(), 10)
	for in, want := range map[string]string{"0": "never", five: "5s ago", "junk": "junk"} {
		if got := ago(in); got != want && !(in == five && got == "6s ago") {
			t.Errorf("ago(%q) = %q, want %q", in, got, want)
		}
	}
}
