package hookrun

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// script writes an executable /bin/sh script into a temporary directory.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestEnvironmentExact: the hook sees the documented environment and
// nothing of the daemon's (NOTIFY_SOCKET above all).
func TestEnvironmentExact(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "/run/systemd/notify")
	t.Setenv("NODEAGENT_SECRET", "x")
	st := State{Port: 47123, Previous: 41000}
	r := Run(context.Background(), []string{"/usr/bin/env"}, st.Env("wg-pia"), 10*time.Second)
	if !r.OK() {
		t.Fatalf("env: %v %s", r.Err, r.Output)
	}
	got := strings.Split(r.Output, "\n")
	want := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C.UTF-8",
		"NODEAGENT_PIA_DEVICE=wg-pia",
		"NODEAGENT_PIA_PORT=47123",
		"NODEAGENT_PIA_PREVIOUS_PORT=41000",
		"NODEAGENT_PIA_PORT_LOST=0",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("environment:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	lost := State{Previous: 47123, Lost: true}.Env("wg-pia")
	if !slices.Contains(lost, "NODEAGENT_PIA_PORT=0") || !slices.Contains(lost, "NODEAGENT_PIA_PORT_LOST=1") {
		t.Errorf("a lost port's environment: %v", lost)
	}
}

// TestProcessGroupAndDir: the hook leads its own process group, runs from
// / with stdin empty.
func TestProcessGroupAndDir(t *testing.T) {
	hook := script(t, `ps -o pid=,pgid= -p $$; pwd; cat; echo end`)
	r := Run(context.Background(), []string{hook}, nil, 10*time.Second)
	if !r.OK() {
		t.Fatalf("%v %s", r.Err, r.Output)
	}
	lines := strings.Split(r.Output, "\n")
	if f := strings.Fields(lines[0]); len(f) != 2 || f[0] != f[1] {
		t.Errorf("pid and pgid %q: not the leader of its own group", lines[0])
	}
	if len(lines) != 3 || lines[1] != "/" || lines[2] != "end" {
		t.Errorf("output %q, want the group, / and end (stdin empty)", r.Output)
	}
}

// TestTimeoutKillsGroup: a hook that forks a sleep and hangs is killed at
// the timeout with the sleep, reported as a timeout.
func TestTimeoutKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	// The child ignores SIGTERM: only the SIGKILL after the grace ends it.
	hook := script(t, "(trap '' TERM; exec sleep 500) &\necho $! > "+pidFile+"\necho started\nsleep 500\n")
	r := Run(context.Background(), []string{hook}, nil, time.Second)
	if !r.TimedOut || r.OK() || r.Outcome() != "timeout" || r.ExitStatus() != "timeout" {
		t.Fatalf("a hung hook: %+v", r)
	}
	if !strings.HasPrefix(r.FirstLine(), "timed out after 1s: started") {
		t.Errorf("first line %q", r.FirstLine())
	}
	pid := readPid(t, pidFile)
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the hook's child %d survived the timeout", pid)
	}
}

// TestBackgroundJobIsSuccess: a hook that leaves a job holding its output
// and exits 0 succeeded, and the run does not wait for the job.
func TestBackgroundJobIsSuccess(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	hook := script(t, "sleep 500 &\necho $! > "+pidFile+"\necho configured\n")
	r := Run(context.Background(), []string{hook}, nil, 30*time.Second)
	pid := readPid(t, pidFile)
	defer syscall.Kill(pid, syscall.SIGKILL)
	if !r.OK() || r.Exit != 0 || r.Outcome() != "success" || r.Output != "configured" {
		t.Fatalf("a hook that left a job: %+v", r)
	}
	if r.Took > 10*time.Second {
		t.Errorf("the run waited %s for the background job", r.Took)
	}
	if !alive(pid) {
		t.Error("the background job of a successful hook was killed")
	}
}

// TestFailureAndCap: a non-zero exit fails with its first line; output
// past 4 KiB is dropped.
func TestFailureAndCap(t *testing.T) {
	hook := script(t, "echo 'qbittorrent: 401 Unauthorized'\necho more\nhead -c 10000 /dev/zero | tr '\\0' x\nexit 3\n")
	r := Run(context.Background(), []string{hook}, nil, 10*time.Second)
	if r.OK() || r.Exit != 3 || r.Outcome() != "failure" || r.ExitStatus() != "exit 3" {
		t.Fatalf("%+v", r)
	}
	if r.FirstLine() != "exit status 3: qbittorrent: 401 Unauthorized" {
		t.Errorf("first line %q", r.FirstLine())
	}
	if len(r.Output) != OutputCap {
		t.Errorf("kept %d bytes of output, want %d", len(r.Output), OutputCap)
	}
	if r := Run(context.Background(), []string{"/nonexistent/hook"}, nil, time.Second); r.OK() || r.ExitStatus() != "not started" {
		t.Errorf("a missing hook: %+v", r)
	}
}

func TestBackoff(t *testing.T) {
	var got []time.Duration
	for n := 1; n <= 9; n++ {
		got = append(got, backoff(n, BackoffMin, BackoffMax))
	}
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("backoff %v, want %v", got, want)
	}
}

// outcomes collects a scheduler's outcomes.
type outcomes struct {
	mu  sync.Mutex
	all []Outcome
}

func (o *outcomes) add(x Outcome) { o.mu.Lock(); o.all = append(o.all, x); o.mu.Unlock() }
func (o *outcomes) get() []Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.all)
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestRetryUntilSuccess: a failing hook is run again with backoff until it
// succeeds, then left alone (no every).
func TestRetryUntilSuccess(t *testing.T) {
	dir := t.TempDir()
	count := filepath.Join(dir, "count")
	// Fails the first three runs.
	hook := script(t, "echo x >> "+count+"\n[ $(wc -l < "+count+") -gt 3 ] || { echo \"not yet $NODEAGENT_PIA_PORT\"; exit 1; }\n")
	var o outcomes
	s := Start(t.Context(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: 5 * time.Second, BackoffMin: 10 * time.Millisecond, BackoffMax: 40 * time.Millisecond}, nil, o.add)
	defer s.Stop()
	s.Set(State{Port: 47123})
	waitFor(t, "a success", 10*time.Second, func() bool { return s.Status().Delivered })
	got := o.get()
	if len(got) != 4 {
		t.Fatalf("%d runs, want 4", len(got))
	}
	for i, x := range got {
		if x.Attempt != i+1 || x.Result.OK() != (i == 3) || x.State.Port != 47123 {
			t.Errorf("run %d: attempt %d ok %v state %+v", i, x.Attempt, x.Result.OK(), x.State)
		}
	}
	if got[0].Result.FirstLine() != "exit status 1: not yet 47123" {
		t.Errorf("first line %q", got[0].Result.FirstLine())
	}
	if st := s.Status(); st.Failures != 0 || !st.Next.IsZero() || st.Last.Exit != 0 {
		t.Errorf("after the success: %+v", st)
	}
	time.Sleep(200 * time.Millisecond)
	if n := len(o.get()); n != 4 {
		t.Errorf("%d runs after the success without every, want 4", n)
	}
}

// TestTimeoutThenNextAttempt: a hook killed at its timeout is run again,
// and the next attempt can succeed.
func TestTimeoutThenNextAttempt(t *testing.T) {
	dir := t.TempDir()
	count := filepath.Join(dir, "count")
	pidFile := filepath.Join(dir, "pid")
	hook := script(t, "echo x >> "+count+"\nif [ $(wc -l < "+count+") -eq 1 ]; then sleep 500 & echo $! > "+pidFile+"; sleep 500; fi\n")
	var o outcomes
	s := Start(t.Context(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: 500 * time.Millisecond, BackoffMin: 10 * time.Millisecond}, nil, o.add)
	defer s.Stop()
	s.Set(State{Port: 47123})
	waitFor(t, "a success", 15*time.Second, func() bool { return s.Status().Delivered })
	got := o.get()
	if len(got) != 2 || got[0].Result.Outcome() != "timeout" || got[1].Result.Outcome() != "success" || got[1].Attempt != 2 {
		t.Fatalf("outcomes %+v", got)
	}
	if pid := readPid(t, pidFile); alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the timed-out hook's sleep %d survived", pid)
	}
}

// TestNoOverlap: ten state changes during a slow run wait for it; then
// one run delivers the newest state. Overlaps are caught by a lock
// directory the hook takes.
func TestNoOverlap(t *testing.T) {
	dir := t.TempDir()
	lock, log, overlaps := filepath.Join(dir, "lock"), filepath.Join(dir, "log"), filepath.Join(dir, "overlaps")
	hook := script(t, "mkdir "+lock+" 2>/dev/null || echo overlap >> "+overlaps+"\nsleep 0.5\necho $NODEAGENT_PIA_PORT $NODEAGENT_PIA_PREVIOUS_PORT >> "+log+"\nrmdir "+lock+"\n")
	var o outcomes
	s := Start(t.Context(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: 10 * time.Second, BackoffMin: 10 * time.Millisecond}, nil, o.add)
	defer s.Stop()
	s.Set(State{Port: 1000})
	waitFor(t, "the first run", 5*time.Second, func() bool { return s.Status().Running })
	for i := 1; i <= 10; i++ {
		s.Set(State{Port: 1000 + i, Previous: 1000 + i - 1})
	}
	waitFor(t, "the newest port delivered", 10*time.Second, func() bool { return s.Status().Delivered })
	time.Sleep(300 * time.Millisecond)
	if b, err := os.ReadFile(overlaps); err == nil {
		t.Errorf("runs overlapped: %s", b)
	}
	b, _ := os.ReadFile(log)
	if got := strings.TrimSpace(string(b)); got != "1000 0\n1010 1009" {
		t.Errorf("runs:\n%s\nwant the first port, then the newest only", got)
	}
	if st := s.Status(); st.Want.Port != 1010 || !st.Delivered {
		t.Errorf("status %+v", st)
	}
}

// TestEvery: after a success the hook runs again with the current state
// every Every; a state given as delivered at start waits for Every.
func TestEvery(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	hook := script(t, "echo $NODEAGENT_PIA_PORT >> "+log+"\n")
	var o outcomes
	st := State{Port: 47123}
	s := Start(t.Context(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: 5 * time.Second, Every: 100 * time.Millisecond}, &st, o.add)
	defer s.Stop()
	if s.Status().Delivered != true {
		t.Error("a state delivered before is not reported delivered")
	}
	s.Set(st) // the same state: nothing to run now
	if n := len(o.get()); n != 0 {
		t.Errorf("%d runs at once for a delivered state", n)
	}
	waitFor(t, "three periodic runs", 10*time.Second, func() bool { return len(o.get()) >= 3 })
	for _, x := range o.get() {
		if x.State != st || !x.Result.OK() {
			t.Errorf("periodic run %+v", x)
		}
	}
	// every 0 (a reload): no more periodic runs.
	s.Reconfigure(Config{Device: "wg-pia", Argv: []string{hook}, Timeout: 5 * time.Second})
	time.Sleep(150 * time.Millisecond)
	n := len(o.get())
	time.Sleep(300 * time.Millisecond)
	if m := len(o.get()); m != n {
		t.Errorf("%d runs after every was turned off", m-n)
	}
	// A new command has delivered nothing: it runs at once.
	other := script(t, "echo other >> "+log+"\n")
	s.Reconfigure(Config{Device: "wg-pia", Argv: []string{other}, Timeout: 5 * time.Second})
	waitFor(t, "the new command's run", 5*time.Second, func() bool { b, _ := os.ReadFile(log); return strings.Contains(string(b), "other") })
}

// TestStopKillsRun: stopping the scheduler kills the hook's group.
func TestStopKillsRun(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	hook := script(t, "sleep 500 &\necho $! > "+pidFile+"\nsleep 500\n")
	s := Start(context.Background(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: time.Minute}, nil, nil)
	s.Set(State{Port: 1})
	waitFor(t, "the hook's child", 5*time.Second, func() bool { _, err := os.Stat(pidFile); return err == nil })
	time.Sleep(50 * time.Millisecond)
	s.Stop()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the scheduler did not stop")
	}
	if pid := readPid(t, pidFile); alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the stopped hook's sleep %d survived", pid)
	}
}

// TestTookIsTheRunsDuration: Result.Took is how long the run took (it was
// 0 for every run, so every log line said took=0s).
func TestTookIsTheRunsDuration(t *testing.T) {
	r := Run(t.Context(), []string{script(t, "sleep 0.3\n")}, nil, 5*time.Second)
	if !r.OK() || r.Took < 300*time.Millisecond || r.Took > 5*time.Second {
		t.Errorf("took %s (ok %v), want about 300ms", r.Took, r.OK())
	}
}

// TestNewCommandDuringRun: a reload that changes the command while the old
// one runs: the old run's success is not the new command's (no "delivered"
// and no wait of every), nor is its failure (no backoff): the new command
// runs as soon as the old run ended.
func TestNewCommandDuringRun(t *testing.T) {
	for _, oldExit := range []int{0, 1} {
		t.Run("old exits "+strconv.Itoa(oldExit), func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "log")
			old := script(t, "sleep 1\necho old $(date +%s.%N) >> "+log+"\nexit "+strconv.Itoa(oldExit)+"\n")
			neu := script(t, "echo new $(date +%s.%N) >> "+log+"\n")
			var o outcomes
			cfg := Config{Device: "wg-pia", Argv: []string{old}, Timeout: 10 * time.Second, Every: 5 * time.Minute, BackoffMin: time.Minute}
			s := Start(t.Context(), cfg, nil, o.add)
			defer s.Stop()
			s.Set(State{Port: 47000})
			waitFor(t, "the old command running", 5*time.Second, func() bool { return s.Status().Running })
			cfg.Argv = []string{neu}
			s.Reconfigure(cfg)
			if st := s.Status(); st.Delivered {
				t.Errorf("delivered right after a new command: %+v", st)
			}
			waitFor(t, "the new command's run", 5*time.Second, func() bool { return len(o.get()) >= 2 })
			got := o.get()
			if !got[0].Stale || got[1].Stale || !got[1].Result.OK() {
				t.Errorf("outcomes %+v", got)
			}
			lines := strings.Fields(strings.ReplaceAll(readFile(log), "\n", " "))
			if len(lines) != 4 || lines[0] != "old" || lines[2] != "new" {
				t.Fatalf("runs: %q", lines)
			}
			end, _ := strconv.ParseFloat(lines[1], 64)
			began, _ := strconv.ParseFloat(lines[3], 64)
			gap := time.Duration((began - end) * float64(time.Second))
			t.Logf("old run (exit %d) ended -> new command ran %s later", oldExit, gap.Round(time.Millisecond))
			if gap > time.Second {
				t.Errorf("the new command ran %s after the old run ended, want within 1s", gap)
			}
			if st := s.Status(); !st.Delivered || st.Failures != 0 {
				t.Errorf("after the new command's success: %+v", st)
			}
		})
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// TestRefusedWaitsAndHolds: a hook that exits ExitRefused is attempted
// again no sooner than RefusedWait, whatever its backoff, and not at all
// after RefusedMax such runs in a row, not even for a new port; Retry
// lifts the hold; a success clears the count.
func TestRefusedWaitsAndHolds(t *testing.T) {
	dir := t.TempDir()
	log, ok := filepath.Join(dir, "log"), filepath.Join(dir, "ok")
	hook := script(t, "echo $(date +%s.%N) $NODEAGENT_PIA_PORT >> "+log+"\n[ -e "+ok+" ] && exit 0\necho 'login refused'\nexit 77\n")
	var o outcomes
	const wait = 400 * time.Millisecond
	s := Start(t.Context(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: 5 * time.Second,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond, RefusedWait: wait, RefusedMax: 3}, nil, o.add)
	defer s.Stop()
	s.Set(State{Port: 47000})
	waitFor(t, "held after three refusals", 10*time.Second, func() bool { return s.Status().Held })
	got := o.get()
	if len(got) != 3 || !got[2].Held || got[1].Held {
		t.Fatalf("outcomes %+v", got)
	}
	for i := 1; i < len(got); i++ {
		if gap := got[i].Result.Start.Sub(got[i-1].Result.Start); gap < wait {
			t.Errorf("refused runs %d and %d %s apart, want at least %s", i-1, i, gap, wait)
		}
	}
	if st := s.Status(); st.Refused != 3 || !st.Next.IsZero() || st.Delivered {
		t.Errorf("held: %+v", st)
	}
	// A new port does not lift the hold.
	s.Set(State{Port: 51000, Previous: 47000})
	time.Sleep(3 * wait)
	if n := len(o.get()); n != 3 {
		t.Errorf("%d runs while held, want none", n-3)
	}
	// The operator fixed it and retries: run now, delivered.
	os.WriteFile(ok, nil, 0o644)
	if !s.Retry(false) {
		t.Fatal("Retry scheduled nothing")
	}
	waitFor(t, "delivered after the retry", 5*time.Second, func() bool { return s.Status().Delivered })
	if st := s.Status(); st.Refused != 0 || st.Held || st.Want.Port != 51000 {
		t.Errorf("after the retry: %+v", st)
	}
	if s.Retry(true) {
		t.Error("Retry(failedOnly) ran a hook that delivered its state")
	}
}

// TestRetryFailedNow: a failing hook waiting for its backoff runs at once
// on Retry(true).
func TestRetryFailedNow(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	hook := script(t, "echo x >> "+log+"\nexit 1\n")
	var o outcomes
	s := Start(t.Context(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: 5 * time.Second, BackoffMin: time.Hour}, nil, o.add)
	defer s.Stop()
	s.Set(State{Port: 47000})
	waitFor(t, "a failure", 5*time.Second, func() bool { return len(o.get()) == 1 })
	if !s.Retry(true) {
		t.Fatal("Retry(failedOnly) scheduled nothing for a failed hook")
	}
	waitFor(t, "the retry", 5*time.Second, func() bool { return len(o.get()) == 2 })
	if st := s.Status(); st.Failures != 2 {
		t.Errorf("after the retry: %+v", st)
	}
}

// TestStopEndsAStubbornHook: a hook that ignores SIGTERM is killed
// KillGrace later, with what it started; Done waits for that.
func TestStopEndsAStubbornHook(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	hook := script(t, "trap '' TERM\nsleep 500 &\necho $! > "+pidFile+"\nwhile :; do sleep 0.1; done\n")
	s := Start(context.Background(), Config{Device: "wg-pia", Argv: []string{hook}, Timeout: time.Minute}, nil, nil)
	s.Set(State{Port: 1})
	waitFor(t, "the hook's child", 5*time.Second, func() bool { _, err := os.Stat(pidFile); return err == nil })
	pid := readPid(t, pidFile)
	start := time.Now()
	s.Stop()
	select {
	case <-s.Done():
	case <-time.After(KillGrace + 5*time.Second):
		t.Fatal("the scheduler did not stop")
	}
	t.Logf("a hook ignoring SIGTERM ended %s after Stop (KillGrace %s)", time.Since(start).Round(10*time.Millisecond), KillGrace)
	if alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the stopped hook's sleep %d survived Done", pid)
	}
}
