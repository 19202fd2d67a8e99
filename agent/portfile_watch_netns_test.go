package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/nodeagent/nodeagent/testenv/piastub"
	"golang.org/x/sys/unix"
)

// inotifyWatch is one inotify instance with one watch, recording the
// events it gets (name, mask) until the test ends; onEvent, when set, is
// called for each as it comes.
type inotifyWatch struct {
	mu      sync.Mutex
	events  []inotifyEvent
	onEvent func(inotifyEvent)
}

type inotifyEvent struct {
	name string
	mask uint32
}

func watchInotify(t *testing.T, path string, mask uint32, onEvent func(inotifyEvent)) *inotifyWatch {
	t.Helper()
	w, err := tryWatchInotify(t, path, mask, onEvent)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// tryWatchInotify is watchInotify that returns the error (path missing).
func tryWatchInotify(t *testing.T, path string, mask uint32, onEvent func(inotifyEvent)) (*inotifyWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, path, mask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify watch on %s: %w", path, err)
	}
	// Non-blocking, so the runtime's poller serves it and Close ends Read.
	f := os.NewFile(uintptr(fd), "inotify")
	w := &inotifyWatch{onEvent: onEvent}
	done := make(chan struct{})
	t.Cleanup(func() { f.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := string(buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)])
				e := inotifyEvent{strings.TrimRight(name, "\x00"), ev.Mask}
				off += unix.SizeofInotifyEvent + int(ev.Len)
				if w.onEvent != nil {
					w.onEvent(e)
				}
				w.mu.Lock()
				w.events = append(w.events, e)
				w.mu.Unlock()
			}
		}
	}()
	return w, nil
}

// count is how many events for name (any name when "") had a bit of mask.
func (w *inotifyWatch) count(name string, mask uint32) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.events {
		if (name == "" || e.name == name) && e.mask&mask != 0 {
			n++
		}
	}
	return n
}

// TestPortFileWatch: the port file is replaced by rename (fsafe.WriteFile:
// a temporary file in the directory, written, closed, renamed over the
// old one), so a consumer that watches the directory for IN_MOVED_TO of
// DEVICE.port sees every new port, while one that watches the file itself
// for IN_CLOSE_WRITE never fires: nothing ever writes the file it
// watches, whose inode is replaced (its watch ends with IN_IGNORED).
func TestPortFileWatch(t *testing.T) {
	l, _ := pfLab(t, piastub.Options{})
	socket := filepath.Join(l.Dir, "run", "nodeagent.sock")
	dir := filepath.Join(filepath.Dir(socket), "pia")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := l.Dev + ".port"
	file := filepath.Join(dir, name)

	// The directory watcher reads the file at each IN_MOVED_TO of its
	// name, as a consumer would.
	var mu sync.Mutex
	var seen []int
	dirWatch := watchInotify(t, dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_CREATE|unix.IN_DELETE, func(e inotifyEvent) {
		if e.name != name || e.mask&unix.IN_MOVED_TO == 0 {
			return
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return
		}
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			mu.Lock()
			seen = append(seen, p)
			mu.Unlock()
		}
	})
	sawPort := func(p int) bool { mu.Lock(); defer mu.Unlock(); return slices.Contains(seen, p) }

	r := startDaemon(t, l.Node, l.Config, func(o *RunOptions) {
		o.StateDir, o.PIATimers, o.Socket = l.StateDir, fastPF, socket
	})
	r.socket = socket
	waitFor(t, "the port bound", 60*time.Second, func() bool { return forwardedPort(r) != 0 })
	ports := []int{forwardedPort(r)}
	waitFor(t, "IN_MOVED_TO of the first port", 10*time.Second, func() bool { return sawPort(ports[0]) })

	// The file watch, on the file as it is now (PIA may take a new port,
	// and the file may be gone for a moment, just after the first).
	var fileWatch *inotifyWatch
	waitFor(t, "a watch on the port file", 10*time.Second, func() bool {
		var err error
		fileWatch, err = tryWatchInotify(t, file, unix.IN_CLOSE_WRITE|unix.IN_MODIFY|unix.IN_DELETE_SELF|unix.IN_IGNORED|unix.IN_ATTRIB, nil)
		return err == nil
	})

	// Each change is one IN_MOVED_TO; a reader that is slow may read a
	// later port than the event's (PIA can change it twice in a second),
	// so what it last read is compared with the current port.
	lastRead := func() int { mu.Lock(); defer mu.Unlock(); return seen[len(seen)-1] }
	for range 2 {
		old := ports[len(ports)-1]
		l.Stub.Servers[0].Restart()
		waitFor(t, "a new port", 60*time.Second, func() bool { p := forwardedPort(r); return p != 0 && p != old })
		waitFor(t, "IN_MOVED_TO of the new port", 10*time.Second, func() bool { p := forwardedPort(r); return lastRead() == p })
		ports = append(ports, forwardedPort(r))
	}
	mu.Lock()
	t.Logf("ports %v; the directory watcher read %v at its IN_MOVED_TO events", ports, seen)
	mu.Unlock()
	if n := dirWatch.count(name, unix.IN_MOVED_TO); n < len(ports) {
		t.Errorf("%d IN_MOVED_TO for %s, want one for each of the ports %v at least", n, name, ports)
	}
	if n := dirWatch.count(name, unix.IN_CLOSE_WRITE); n != 0 {
		t.Errorf("%d IN_CLOSE_WRITE for %s in the directory: the file was written in place", n, name)
	}
	if n := dirWatch.count("", unix.IN_CLOSE_WRITE); n < len(ports)-1 {
		t.Errorf("%d IN_CLOSE_WRITE in the directory (of the temporary files), want >= %d", n, len(ports)-1)
	}
	if n := fileWatch.count("", unix.IN_CLOSE_WRITE|unix.IN_MODIFY); n != 0 {
		t.Errorf("the watch on the file itself saw %d writes: the file was written in place, not replaced", n)
	}
	if fileWatch.count("", unix.IN_IGNORED|unix.IN_DELETE_SELF) == 0 {
		t.Error("the watch on the file itself did not end: the file was not replaced")
	}
}
