package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// wholeMask are the events after which the config file is whole: a writer
// closed it (IN_CLOSE_WRITE), a file was renamed over it (IN_MOVED_TO), it
// went (IN_DELETE, IN_MOVED_FROM), or its mode or owner changed
// (IN_ATTRIB). IN_CREATE and IN_MODIFY are not among them: the file is
// still being written then, and is never read half-way. (fsnotify folds
// IN_MOVED_TO into Create and IN_CLOSE_WRITE into nothing, so it cannot
// tell these apart.)
const wholeMask = unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_ATTRIB

// writingMask are the events that say the config file is being written.
const writingMask = unix.IN_CREATE | unix.IN_MODIFY

// configWrites watches the config file's directory with inotify for
// wholeMask and kicks on each event for the file. While it runs (on),
// the general file watch leaves the config file's events to it. Between
// a write (writingMask) and the event that makes the file whole, writing
// is set: a resync then keeps the running config rather than read the
// file half-way.
type configWrites struct {
	on      atomic.Bool
	writing atomic.Bool
}

// Writing reports whether the config file is being written now.
func (cw *configWrites) Writing() bool { return cw != nil && cw.on.Load() && cw.writing.Load() }

// watchConfigWrites starts the watch; an error leaves it off, and the
// general watch reads the config on every event as before.
func watchConfigWrites(ctx context.Context, config string, kick func()) (*configWrites, error) {
	cw := &configWrites{}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return cw, err
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(config), wholeMask|writingMask); err != nil {
		unix.Close(fd)
		return cw, err
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads wait in the poller
	base := []byte(filepath.Base(config))
	cw.on.Store(true)
	go func() {
		<-ctx.Done()
		f.Close()
	}()
	go func() {
		defer cw.on.Store(false)
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				end := off + unix.SizeofInotifyEvent + int(ev.Len)
				if end > n {
					break
				}
				name := bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:end], "\x00")
				switch {
				case ev.Mask&unix.IN_Q_OVERFLOW != 0:
					cw.writing.Store(false)
					kick()
				case bytes.Equal(name, base) && ev.Mask&writingMask != 0:
					cw.writing.Store(true)
				case bytes.Equal(name, base) && ev.Mask&unix.IN_ATTRIB != 0:
					kick()
				case bytes.Equal(name, base):
					cw.writing.Store(false)
					kick()
				case ev.Mask&unix.IN_IGNORED != 0:
					// The directory went: the general watch, which
					// follows it through its parent, takes over.
					return
				}
				off = end
			}
		}
	}()
	return cw, nil
}
