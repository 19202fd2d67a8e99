// Package hookrun runs the commands nodeagent hands an event to (a PIA
// device's portForward.onChange) and keeps running them until they took
// it: Run runs one hook, Scheduler converges one device's.
//
// A hook runs without a shell, with a clean environment (Env plus what the
// caller adds: never the daemon's own, NOTIFY_SOCKET included), in its own
// process group, from /, with stdin /dev/null and stdout and stderr on a
// pipe of which the first OutputCap bytes are kept. Success is the hook's
// own exit status 0: a background job it left behind neither fails it nor
// holds it up (its output is read, and thrown away, for as long as it
// keeps the pipe open). At the timeout the whole process group is sent
// SIGTERM and, KillGrace later, SIGKILL; so is it when the caller's
// context ends (the daemon stopping), and the run returns only once the
// group is gone.
//
// A hook that exits ExitRefused (77, sysexits' EX_NOPERM) says that what
// it talks to refused its credentials or key, or banned it: the Scheduler
// then waits at least RefusedWait before the next attempt and stops after
// RefusedMax such runs in a row, so that nodeagent's retries never add up
// to a client's ban of the node's address.
package hookrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Env is the environment every hook starts from; the caller's variables
// (NODEAGENT_*) are added to it, nothing else.
var Env = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LC_ALL=C.UTF-8",
}

const (
	// OutputCap is how much of a hook's output (stdout and stderr, as
	// written) is kept; the rest is read and discarded.
	OutputCap = 4096
	// KillGrace is how long a timed-out (or stopped) hook's process group
	// has between SIGTERM and SIGKILL: room for a hook's own clean-up on
	// SIGTERM (a WebUI logout of a few seconds).
	KillGrace = 5 * time.Second
	// ReapGrace bounds the wait, after SIGKILL, for the group's members to
	// be reaped.
	ReapGrace = 2 * time.Second
	// PipeGrace is how long the output is waited for once the hook itself
	// exited: a background job that holds the pipe open is not waited for
	// longer.
	PipeGrace = 250 * time.Millisecond
)

// Result is one run of a hook.
type Result struct {
	Start time.Time
	Took  time.Duration
	// Exit is the hook's exit status; -1 when it did not exit by itself
	// (killed, or it never started).
	Exit int
	// TimedOut: the hook was killed at the timeout.
	TimedOut bool
	// Err is why the run failed; nil for exit 0.
	Err error
	// Output is the first OutputCap bytes of stdout and stderr, trimmed.
	Output string
}

// OK reports whether the hook exited 0.
func (r Result) OK() bool { return r.Err == nil }

// ExitRefused is the exit status by which a hook says that what it talks
// to refused its credentials or key, or banned this node (sysexits'
// EX_NOPERM): a retry cannot help before someone fixes them, and retries
// could get the node's address banned.
const ExitRefused = 77

// Refused reports whether the hook exited ExitRefused.
func (r Result) Refused() bool { return r.Exit == ExitRefused }

// Outcome is "success", "failure" or "timeout", as the metrics count runs.
func (r Result) Outcome() string {
	switch {
	case r.TimedOut:
		return "timeout"
	case r.Err != nil:
		return "failure"
	}
	return "success"
}

// ExitStatus describes how the hook ended: "exit 0", "exit 3",
// "timeout", "killed by signal hangup", "not started".
func (r Result) ExitStatus() string {
	var ee *exec.ExitError
	switch {
	case r.TimedOut:
		return "timeout"
	case r.Exit >= 0:
		return fmt.Sprintf("exit %d", r.Exit)
	case errors.As(r.Err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by signal " + ws.Signal().String()
		}
		return ee.Error()
	}
	return "not started"
}

// FirstLine is the first line that says why the run failed: the first
// non-empty line of its output, else of its error; "" for a success.
func (r Result) FirstLine() string {
	if r.Err == nil {
		return ""
	}
	msg := r.Err.Error()
	if out := firstLine(r.Output); out != "" {
		msg += ": " + out
	}
	return msg
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}

// Run runs argv (argv[0] an absolute path; no shell) with Env plus env,
// for at most timeout, and returns how it went. A cancelled ctx ends the
// run as the timeout does (the process group is killed).
func Run(ctx context.Context, argv, env []string, timeout time.Duration) (r Result) {
	r = Result{Start: time.Now(), Exit: -1}
	// On the named result: a deferred assignment to a copy would be lost.
	defer func() { r.Took = time.Since(r.Start) }()
	if len(argv) == 0 {
		r.Err = errors.New("no command")
		return r
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		r.Err = err
		return r
	}
	defer pr.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append([]string{}, Env...), env...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	pw.Close() // the hook and whatever it starts hold the only write ends
	if err != nil {
		r.Err = err
		return r
	}
	out := &capped{}
	eof := make(chan struct{})
	go func() {
		// Read until every holder of the pipe is gone: a background job's
		// output is discarded, not left to block on a full pipe.
		io.Copy(out, pr)
		close(eof)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	pgid := cmd.Process.Pid
	var werr error
	select {
	case werr = <-exited:
	case <-timer.C:
		r.TimedOut = true
		werr = killGroup(pgid, exited)
	case <-ctx.Done():
		werr = killGroup(pgid, exited)
		r.Err = fmt.Errorf("stopped: %w", ctx.Err())
	}
	select {
	case <-eof:
	case <-time.After(PipeGrace):
	}
	r.Output = out.String()
	switch {
	case r.TimedOut:
		r.Err = fmt.Errorf("timed out after %s", timeout)
	case r.Err != nil:
	case werr != nil:
		r.Err = werr
		var ee *exec.ExitError
		if errors.As(werr, &ee) {
			r.Exit = ee.ExitCode()
		}
	default:
		r.Exit = 0
	}
	return r
}

// killGroup ends process group pgid: SIGTERM, then SIGKILL once the group
// is gone or KillGrace passed. It returns the leader's wait error.
func killGroup(pgid int, exited <-chan error) error {
	syscall.Kill(-pgid, syscall.SIGTERM)
	var werr error
	done := false
	deadline := time.Now().Add(KillGrace)
	for time.Now().Before(deadline) {
		if !done {
			select {
			case werr = <-exited:
				done = true
			default:
			}
		}
		// ESRCH: no process is left in the group (the leader reaped).
		if done && syscall.Kill(-pgid, 0) != nil {
			return werr
		}
		time.Sleep(20 * time.Millisecond)
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	if !done {
		werr = <-exited
	}
	// Killed, the group's other members are reaped by whoever adopted
	// them (init): until then they are still in the group. Returning only
	// once they are gone lets a caller that stops say that nothing of the
	// hook is left.
	for end := time.Now().Add(ReapGrace); time.Now().Before(end) && syscall.Kill(-pgid, 0) == nil; {
		time.Sleep(10 * time.Millisecond)
	}
	return werr
}

// capped keeps the first OutputCap bytes written to it.
type capped struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := OutputCap - c.b.Len(); room > 0 {
		c.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.TrimSpace(c.b.String())
}
