// Package logging makes nodeagent's logger. On a terminal or a pipe it is
// slog's logfmt (time=... level=... msg=...). When stderr is systemd's
// journal stream, each line starts with its syslog priority as sd-daemon(3)
// prefixes it ("<4>" for a warning), so `journalctl -p warning` finds
// warnings and errors, and carries no time key: the journal stamps every
// line itself, and a second timestamp in the text is only noise.
package logging

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// New returns the logger for w at level: journal-formatted when w is the
// stream systemd connected to the journal (see Journal), logfmt otherwise.
func New(w io.Writer, level slog.Leveler) *slog.Logger {
	f, _ := w.(*os.File)
	return slog.New(NewHandler(w, &slog.HandlerOptions{Level: level}, f != nil && Journal(f, os.Getenv("JOURNAL_STREAM"))))
}

// Journal reports whether f is the journal stream systemd named in
// JOURNAL_STREAM ("DEVICE:INODE", decimal), as sd-daemon(3) says to check
// it: the variable is inherited by children whose stderr goes elsewhere,
// so the file itself must be that stream.
func Journal(f *os.File, journalStream string) bool {
	dev, ino, ok := strings.Cut(journalStream, ":")
	if !ok {
		return false
	}
	d, err := strconv.ParseUint(dev, 10, 64)
	if err != nil {
		return false
	}
	i, err := strconv.ParseUint(ino, 10, 64)
	if err != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return uint64(st.Dev) == d && uint64(st.Ino) == i
}

// NewHandler returns a logfmt handler writing to w; with journal set, each
// record is one line that starts with its priority (Priority) and has no
// time key.
func NewHandler(w io.Writer, opts *slog.HandlerOptions, journal bool) slog.Handler {
	if !journal {
		return slog.NewTextHandler(w, opts)
	}
	o := slog.HandlerOptions{}
	if opts != nil {
		o = *opts
	}
	replace := o.ReplaceAttr
	o.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		if replace != nil {
			return replace(groups, a)
		}
		return a
	}
	j := &journalHandler{w: w, shared: &shared{}}
	j.text = slog.NewTextHandler(&j.shared.buf, &o)
	return j
}

// Priority is the syslog priority journald files a record of level under:
// 7 debug, 6 info, 4 warning, 3 error (levels in between round down to the
// more severe: slog's Info+2 is a notice, 5).
func Priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return 3
	case l >= slog.LevelWarn:
		return 4
	case l > slog.LevelInfo:
		return 5
	case l >= slog.LevelInfo:
		return 6
	default:
		return 7
	}
}

// journalHandler formats a record with a TextHandler into a buffer, then
// writes it with its priority prefix in one write, so lines of concurrent
// records never interleave.
type journalHandler struct {
	w      io.Writer
	text   slog.Handler
	shared *shared
}

// shared is what a handler and those derived from it (WithAttrs, WithGroup)
// hold in common: their TextHandlers all write into buf.
type shared struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.text.Enabled(ctx, l)
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	s := h.shared
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Reset()
	s.buf.WriteString("<" + strconv.Itoa(Priority(r.Level)) + ">")
	if err := h.text.Handle(ctx, r); err != nil {
		return err
	}
	_, err := h.w.Write(s.buf.Bytes())
	if s.buf.Cap() > 64<<10 {
		s.buf = bytes.Buffer{} // one huge record must not pin its buffer
	}
	return err
}

func (h *journalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &journalHandler{w: h.w, text: h.text.WithAttrs(attrs), shared: h.shared}
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	return &journalHandler{w: h.w, text: h.text.WithGroup(name), shared: h.shared}
}
