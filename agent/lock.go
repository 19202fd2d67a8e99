package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultLock is the lock file that nodeagent run, apply --once and
// teardown hold while they change the node, so that two of them never
// converge one node at once.
const DefaultLock = "/run/nodeagent/nodeagent.lock"

// Lock takes the lock file at path for this process, which does what (run,
// apply --once, teardown), and returns its release. If another process
// holds it, the error names that process's pid and what it does. The file
// is never removed (a removed lock file races with the next taker); the
// lock goes with the process, however it ends.
func Lock(path, what string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: not a regular file", path)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if errors.Is(err, unix.EWOULDBLOCK) {
		holder := lockHolder(fd)
		unix.Close(fd)
		if what != "run" && strings.HasSuffix(holder, ", run") {
			// The daemon: the service, as a rule. A clean stop leaves
			// the node as it is, for this command to work on.
			return nil, fmt.Errorf("another nodeagent holds %s (%s): the daemon converges this node, and %s cannot while it runs; stop it first: systemctl stop nodeagent", path, holder, what)
		}
		return nil, fmt.Errorf("another nodeagent holds %s (%s); it converges this node, so this one does not", path, holder)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	line := []byte(strconv.Itoa(os.Getpid()) + " " + what + "\n")
	if err := unix.Ftruncate(fd, 0); err == nil {
		unix.Pwrite(fd, line, 0)
	}
	return func() {
		unix.Ftruncate(fd, 0)
		unix.Close(fd) // releases the lock
	}, nil
}

// lockHolder reads "PID WHAT" from a lock file someone holds. The holder
// writes it just after taking the lock, so an empty file is read again
// for a moment.
func lockHolder(fd int) string {
	buf := make([]byte, 128)
	for range 50 {
		n, _ := unix.Pread(fd, buf, 0)
		if s := strings.TrimSpace(string(bytes.TrimRight(buf[:max(n, 0)], "\x00"))); s != "" {
			pid, what, _ := strings.Cut(s, " ")
			if _, err := strconv.Atoi(pid); err != nil {
				break
			}
			if what == "" {
				return "pid " + pid
			}
			return "pid " + pid + ", " + what
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "pid unknown"
}
