// Package earlyhup catches SIGHUP from the daemon's first moments. A
// SIGHUP's default action ends a Go program, and nodeagent's packages take
// tens of milliseconds to initialise (client-go's schemes) before main
// runs: a reload asked for then, or while the daemon starts, must be a
// reload, not the end of the daemon. Its init runs before those packages'
// (it imports only what the runtime has initialised by then), and catches
// SIGHUP for nodeagent run alone; Channel hands the signals over.
package earlyhup

import (
	"os"
	"os/signal"
	"syscall"
)

var ch chan os.Signal

func init() {
	for _, a := range os.Args[1:] {
		if a == "run" {
			ch = make(chan os.Signal, 4)
			signal.Notify(ch, syscall.SIGHUP)
			return
		}
	}
}

// Channel is the SIGHUPs caught since the process began (nil unless the
// command is run): the daemon's reload signal, capacity 4.
func Channel() chan os.Signal { return ch }
