package fsafe

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestWriteFileNeverWrittenInPlace: while children are forked and exec'd
// as fast as can be (a daemon starting hooks), each WriteFile of a file
// shows a directory watch one IN_MOVED_TO of its name and never an
// IN_CLOSE_WRITE of it: no child kept the temporary file's descriptor
// past the rename.
func TestWriteFileNeverWrittenInPlace(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	forks := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if exec.Command("/bin/true").Run() == nil {
				forks++
			}
		}
	}()
	const writes = 400
	path := filepath.Join(dir, "x.port")
	for i := range writes {
		if err := WriteFile(path, []byte{byte('0' + i%10), '\n'}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // the last child's exec
	stop.Store(true)
	wg.Wait()

	moved, inPlace := 0, 0
	buf := make([]byte, 1<<20)
	unix.SetNonblock(fd, true)
	for {
		n, err := unix.Read(fd, buf)
		if n <= 0 || err != nil {
			break
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := string(buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)])
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if trimNUL(name) != "x.port" {
				continue
			}
			if ev.Mask&unix.IN_MOVED_TO != 0 {
				moved++
			}
			if ev.Mask&unix.IN_CLOSE_WRITE != 0 {
				inPlace++
			}
		}
	}
	t.Logf("%d writes while %d children were forked: %d IN_MOVED_TO, %d IN_CLOSE_WRITE of the file", writes, forks, moved, inPlace)
	if moved != writes {
		t.Errorf("%d IN_MOVED_TO, want %d", moved, writes)
	}
	if inPlace != 0 {
		t.Errorf("%d IN_CLOSE_WRITE of the file: a child held the temporary file past its rename", inPlace)
	}
	if _, err := os.Stat(path); err != nil {
		t.Error(err)
	}
}

func trimNUL(s string) string {
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	return s
}
