// Package notify tells systemd how the daemon is doing, over the sd_notify
// protocol: READY=1 after the first full convergence, STATUS= with a one-line
// summary, RELOADING=1 around a config reload, STOPPING=1 on the way out and
// WATCHDOG=1 from the reconcile loop itself.
//
// A Notifier is a value the daemon constructs once; without NOTIFY_SOCKET
// (not started by systemd, or Type=simple) every method is a no-op that costs
// a branch, so the loop can call it unconditionally.
package notify

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// Notifier sends sd_notify messages to the service manager. The zero value
// and a nil *Notifier are valid no-op notifiers. Its methods are safe for
// concurrent use.
type Notifier struct {
	log *slog.Logger
	// enabled is fixed at New: NOTIFY_SOCKET was set. Reading it once means a
	// later change of the environment (by a library, or a child's setup)
	// cannot turn notifications on or off half-way through the daemon's life.
	enabled bool
	// watchdog is WATCHDOG_USEC when the watchdog is meant for this process.
	watchdog time.Duration
	// failing is set while sends fail, so a missing or full socket is logged
	// once per outage rather than on every watchdog ping.
	failing atomic.Bool
}

// New returns a Notifier for the environment the process was started with.
// It reads NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID once, and leaves
// them set: unsetting them would mutate process-global state for no gain.
func New(log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Notifier{log: log, enabled: os.Getenv("NOTIFY_SOCKET") != ""}
	if !n.enabled {
		return n
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		// A malformed WATCHDOG_USEC is systemd's or the operator's mistake;
		// running without pings is better than not running, and systemd
		// will say so if it really expects them.
		log.Warn("ignoring the systemd watchdog settings", "err", err)
		wd = 0
	}
	n.watchdog = wd
	return n
}

// Enabled reports whether the Notifier sends anything, i.e. whether
// NOTIFY_SOCKET was set when it was created.
func (n *Notifier) Enabled() bool { return n != nil && n.enabled }

// Ready tells systemd that start-up (the first full convergence) or a reload
// is complete, with status as the one-line summary ("" for none).
func (n *Notifier) Ready(status string) {
	if !n.Enabled() {
		return
	}
	msg := daemon.SdNotifyReady
	if s := oneLine(status); s != "" {
		msg += "\nSTATUS=" + s
	}
	n.send(msg)
}

// Status sets the one-line status `systemctl status` shows. Newlines are
// replaced by spaces: a newline would start a new, unintended assignment.
func (n *Notifier) Status(status string) {
	if !n.Enabled() {
		return
	}
	n.send("STATUS=" + oneLine(status))
}

// Reloading tells systemd a config reload has begun; Ready ends it.
// MONOTONIC_USEC is what Type=notify-reload (systemd ≥ 253) requires to
// match the message to the reload it asked for; older systemd ignores it.
func (n *Notifier) Reloading() {
	if !n.Enabled() {
		return
	}
	n.send(fmt.Sprintf("%s\nMONOTONIC_USEC=%d", daemon.SdNotifyReloading, monotonicUsec()))
}

// Stopping tells systemd the daemon is shutting down (and leaving the
// kernel state in place).
func (n *Notifier) Stopping() {
	if !n.Enabled() {
		return
	}
	n.send(daemon.SdNotifyStopping)
}

// Watchdog pings the systemd watchdog. The reconcile loop calls it between
// syncs, never a separate ticker: a ticker would keep pinging while the loop
// is wedged, which is exactly what the watchdog is there to catch. It is a
// no-op when no watchdog is configured.
func (n *Notifier) Watchdog() {
	if !n.Enabled() || n.watchdog == 0 {
		return
	}
	n.send(daemon.SdNotifyWatchdog)
}

// WatchdogInterval is WATCHDOG_USEC, or 0 when there is no watchdog for this
// process (unset, or WATCHDOG_PID names another process). The loop should
// ping at half of it so one slow sync does not trip it.
func (n *Notifier) WatchdogInterval() time.Duration {
	if !n.Enabled() {
		return 0
	}
	return n.watchdog
}

func (n *Notifier) send(msg string) {
	// daemon.SdNotify dials NOTIFY_SOCKET (unixgram, "@" for abstract) per
	// message; it is a few syscalls, cheap at the loop's rate.
	sent, err := daemon.SdNotify(false, msg)
	if err == nil && !sent {
		err = errors.New("NOTIFY_SOCKET is no longer set")
	}
	if err != nil {
		if !n.failing.Swap(true) {
			n.log.Warn("sd_notify failed; systemd may consider the service hung", "msg", firstLine(msg), "err", err)
		}
		return
	}
	if n.failing.Swap(false) {
		n.log.Info("sd_notify works again")
	}
}

// oneLine folds status onto one line: sd_notify is newline-separated
// assignments, so an embedded newline would be parsed as another variable.
func oneLine(s string) string {
	s = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
	return strings.TrimSpace(s)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, the clock systemd
// compares MONOTONIC_USEC against.
func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano() / 1e3
}
