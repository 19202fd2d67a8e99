package soak

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/agent/api"
)

// supervisor runs the daemon as systemd runs nodeagent.service: started
// again a second after it exits (Restart=always, RestartSec=1), and
// whatever it left running (a hook) killed when it goes, as the unit's
// cgroup is (KillMode=control-group). A kill of the nemesis's holds it
// down for the fault's downtime first.
type supervisor struct {
	bin, cfg, socket, stateDir, rtTables, logFile string
	clockFile                                     string
	netns, piaDev                                 string
	client                                        *api.Client
	// exited hears of every exit that nobody asked for.
	exited func(pid int, err error, logTail string)

	mu sync.Mutex
	// pid is the running daemon's, 0 when none; started when it was.
	pid     int
	started time.Time
	proc    *os.Process
	// held: a kill is in progress, the daemon stays down until release.
	held    bool
	release chan struct{}
	killed  map[int]bool
	stopped bool
	done    chan struct{}
}

func (s *supervisor) run(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		s.mu.Lock()
		for s.held {
			r := s.release
			s.mu.Unlock()
			select {
			case <-r:
			case <-ctx.Done():
				return
			}
			s.mu.Lock()
		}
		s.mu.Unlock()
		cmd, err := s.start()
		if err != nil {
			s.exited(0, err, "")
			time.Sleep(time.Second)
			continue
		}
		err = cmd.Wait()
		s.mu.Lock()
		pid := cmd.Process.Pid
		asked := s.killed[pid] || s.stopped
		delete(s.killed, pid)
		s.pid, s.proc = 0, nil
		s.mu.Unlock()
		killLeftovers(s.piaDev)
		if !asked {
			s.exited(pid, err, tail(s.logFile, 15))
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
		}
	}
}

func (s *supervisor) start() (*exec.Cmd, error) {
	log, err := os.OpenFile(s.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command("ip", "netns", "exec", s.netns, s.bin, "run", "-c", s.cfg, "--socket", s.socket,
		"--state-dir", s.stateDir, "--lock", "", "--rt-tables", s.rtTables, "--metrics", metricsAddr)
	// The test hooks: SIGUSR1 re-reads the clock step (clock-step).
	cmd.Env = append(os.Environ(), "NODEAGENT_TEST_HOOKS=1", "NODEAGENT_TEST_CLOCK="+s.clockFile)
	cmd.Stdout, cmd.Stderr = log, log
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errors.New("stopped")
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// ip netns exec execs the daemon: the pid is nodeagent's.
	s.pid, s.proc, s.started = cmd.Process.Pid, cmd.Process, time.Now()
	return cmd, nil
}

// Pid is the running daemon's pid and when it started; 0 when none runs.
func (s *supervisor) Pid() (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid, s.started
}

// Kill kills the daemon with sig and holds it down until the returned
// func is called. It reports false when no daemon was running.
func (s *supervisor) Kill(sig syscall.Signal) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = true
	r := make(chan struct{})
	s.release = r
	release = func() {
		s.mu.Lock()
		s.held = false
		s.mu.Unlock()
		close(r)
	}
	if s.proc == nil {
		return release, false
	}
	s.killed[s.pid] = true
	s.proc.Signal(sig)
	return release, true
}

// Signal sends sig to the running daemon, if any.
func (s *supervisor) Signal(sig syscall.Signal) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return false
	}
	return s.proc.Signal(sig) == nil
}

// Stop stops the daemon cleanly (SIGTERM, then SIGKILL after 10 s) and
// the supervisor with it.
func (s *supervisor) Stop() {
	s.mu.Lock()
	s.stopped = true
	p := s.proc
	if s.held {
		s.held = false
		close(s.release)
	}
	s.mu.Unlock()
	if p != nil {
		p.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			p.Kill()
		}
	}
	<-s.done
	killLeftovers(s.piaDev)
}

// killLeftovers kills what a daemon left running (its hooks, and theirs),
// found by the device the hook was run for: as systemd kills what is left
// in a unit's cgroup once its main process is gone.
func killLeftovers(piaDev string) int {
	n := 0
	for _, pid := range hookProcs(piaDev) {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// hookProcs are the processes running with the soak device's hook
// environment (NODEAGENT_PIA_DEVICE=piaDev): a hook and its children.
func hookProcs(piaDev string) []int {
	want := []byte("NODEAGENT_PIA_DEVICE=" + piaDev + "\x00")
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, want) {
			out = append(out, pid)
		}
	}
	return out
}

// procAge is how long ago pid started (from /proc/pid/stat's starttime).
func procAge(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, false
	}
	start, err := strconv.ParseFloat(f[19], 64)
	if err != nil {
		return 0, false
	}
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, false
	}
	var uptime float64
	fmt.Sscanf(string(up), "%f", &uptime)
	return time.Duration((uptime - start/100) * float64(time.Second)), true
}

// procFigures are a process's resident memory (bytes) and open fds.
func procFigures(pid int) (rss int64, fds int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(l, "VmRSS:"); found {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			rss = kb * 1024
		}
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, 0, false
	}
	return rss, len(ents), true
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
