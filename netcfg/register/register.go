// Package register reads the WireGuard peer register: a wireguard[].peersDir
// holding one file per peer, which the daemon reads again on every sync so
// that adding, changing or removing a file changes that one peer.
//
// A file is YAML (*.yaml, *.yml), whose top level is a config.WGPeer:
//
//	description: alice's laptop
//	publicKey: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=
//	presharedKeyFile: /etc/nodeagent/keys/alice.psk
//	allowedIPs: [10.90.0.2/32]
//
// or a wg-quick [Peer] stanza (*.conf), as wg(8) reads it:
//
//	[Peer]
//	PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=
//	PresharedKey = ...
//	AllowedIPs = 10.90.0.3/32, fd00:90::3/128
//
// Either way the peer is named after the file (alice.yaml is alice) unless
// a YAML file sets name.
package register

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"golang.org/x/sys/unix"
)

// maxPeerFileSize bounds a register file. A peer takes a few hundred bytes;
// anything near this is not a peer file, and the daemon reads the register
// on every sync.
const maxPeerFileSize = 64 << 10

// Peer is one peer read from a peersDir file.
type Peer struct {
	// File is the file the peer came from, as joined from the directory
	// given to Load.
	File string
	// Line is the line the peer starts on: the [Peer] line of a wg-quick
	// file, the top-level mapping of a YAML file (1 unless comments come
	// first).
	Line int
	Peer config.WGPeer
	// PresharedKey is an inline preshared key from a wg-quick stanza; YAML
	// files name a Peer.PresharedKeyFile instead. It is a Secret so that it
	// never prints.
	PresharedKey Secret
	// KeyLine and AllowedIPLines are the lines of Peer.PublicKey and of
	// each of Peer.AllowedIPs, so that a duplicate found between files
	// (by Load or Merge) is reported where it is written.
	// Where they are missing, as in a Peer built in code, Line is
	// used.
	KeyLine        int
	AllowedIPLines []int
}

// Secret is key material. Its String, GoString, Format (every verb),
// MarshalJSON, MarshalText and LogValue give "(redacted)", never the
// value, so a key cannot reach a log, an error or a status dump by
// accident; Value returns it for the code that hands it to WireGuard. An
// empty Secret prints as empty, since there is nothing to hide and
// "(redacted)" would claim a key that is not there.
type Secret string

const redacted = "(redacted)"

// Value returns the secret itself.
func (s Secret) Value() string { return string(s) }

// String returns "(redacted)", or "" for an empty Secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString returns String quoted, for %#v.
func (s Secret) GoString() string { return strconv.Quote(s.String()) }

// Format prints String for every verb: without it, %x or %q of a Secret
// would print the value.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'q' || (verb == 'v' && f.Flag('#')) {
		io.WriteString(f, s.GoString())
		return
	}
	io.WriteString(f, s.String())
}

// MarshalJSON encodes String as a JSON string.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(s.String())), nil }

// MarshalText returns String, so encoders that use it (YAML) print no
// value either. encoding/json writes a string-kinded map key as it is,
// without asking it, so never key a map by Secret.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// LogValue makes slog print String.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Contents is what Load read: the good peers in file-name order,
// and one error per file that was skipped.
//
// Each error is an config.ErrorList of *config.FieldError whose File is the skipped
// file, or, when the directory itself could not be read, the directory:
// then Peers is empty and says nothing about what the register holds, so
// a caller should keep the peers it has rather than remove them.
type Contents struct {
	Peers  []Peer
	Errors []error
	// Unreadable reports that the directory itself could not be read:
	// Peers then says nothing about what the register holds, and a caller
	// keeps the peers it has instead of removing them.
	Unreadable bool
}

// Load reads every *.yaml, *.yml and *.conf file in dir, sorted
// by name. Other files are ignored, and so are subdirectories, dotfiles
// (.alice.yaml.swp, .#alice.yaml) and editor backups (alice.yaml~), so that
// an editor at work leaves no half-written peer behind.
//
// A file that does not parse or validate is skipped and reported as
// file:line: field: reason, like the main config's errors. A YAML file is
// checked as a peer in the main config is (field paths are the bare field
// names, like allowedIPs[1]); a wg-quick file's errors name wg's keys, like
// AllowedIPs. A file holding an inline PresharedKey, like a key file, must
// not be readable by group or others unless opts.SkipFileChecks; a file
// over 64 KiB is refused.
//
// Between files, a public key and an allowed prefix belong to one peer
// only (WireGuard would silently move the prefix to the last peer that
// claims it): the later file by name is skipped, with an error naming the
// first.
//
// A missing dir is an empty register, not an error; an unreadable one is
// an error.
func Load(dir string, opts config.Options) Contents {
	return (*Cache)(nil).Load(dir, opts)
}

// Cache keeps what Load parsed, by each file's identity (inode,
// size, modification and change times), so that re-reading a register of
// thousands of peers costs a stat per unchanged file. The daemon re-reads
// the register on every file event and resync; only what changed is parsed
// again. The zero value is ready; a nil cache caches nothing.
type Cache struct {
	mu    sync.Mutex
	files map[string]cachedPeerFile
	// now is the clock; nil means time.Now. Tests move it.
	now func() time.Time
}

type cachedPeerFile struct {
	id     fileID
	p      Peer
	errs   config.ErrorList
	ignore bool
	// racy: the file was modified less than racyWindow before it was
	// parsed. File times move in clock ticks, so a second write in the same
	// tick would leave the identity unchanged; such an entry is parsed again
	// (the "racy git" rule).
	racy bool
}

// racyWindow is how old a file's modification must be, when it is parsed,
// for the result to be trusted on an unchanged identity.
const racyWindow = 2 * time.Second

// fileID is what changes when a file is written, replaced, or has its mode
// changed (ctime moves on chmod).
type fileID struct {
	ino, size      uint64
	mtime, ctime   int64
	skipFileChecks bool
}

func idOf(st unix.Stat_t, opts config.Options) fileID {
	return fileID{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), skipFileChecks: opts.SkipFileChecks}
}

// Load is Load with the cache.
func (c *Cache) Load(dir string, opts config.Options) Contents {
	return c.LoadStream(dir, opts, nil)
}

// chunk is how many files a reading worker takes at a time: the workers
// report a chunk done, and the claims advance over every done chunk that
// has none still being read before it.
const chunk = 16

// LoadStream is Load that also hands the peers it keeps to emit as soon as
// they are final, in name order: a peer's fate depends only on the files
// before it by name (the first file to claim a key or a prefix keeps it),
// so once every file before it is read and claimed it cannot change. The
// peers emit is given, in the order given, are exactly Contents.Peers.
// emit runs on the caller's goroutine while later files are still being
// read; nil emits nothing.
func (c *Cache) LoadStream(dir string, opts config.Options, emit func([]Peer)) Contents {
	d, err := fsafe.OpenDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Contents{}
		}
		return Contents{Unreadable: true, Errors: []error{config.ErrorList{{File: dir, Msg: "cannot read the directory: " + cause(err)}}}}
	}
	defer d.Close()
	entries, err := d.ReadDir()
	if err != nil {
		return Contents{Unreadable: true, Errors: []error{config.ErrorList{{File: dir, Msg: "cannot read the directory: " + cause(err)}}}}
	}
	// Files are read and parsed in parallel (a register of thousands of
	// peers is mostly open, read and YAML parsing), and claimed in name
	// order as the reading advances, so which of two clashing files wins
	// does not depend on timing.
	type loaded struct {
		p      Peer
		errs   config.ErrorList
		ignore bool
	}
	var names, files, formats []string
	cleanDir := filepath.Clean(dir)
	for _, e := range entries {
		format := registerFormat(e.Name())
		if format == "" || e.IsDir() {
			continue
		}
		names = append(names, e.Name())
		files = append(files, fsafe.JoinName(cleanDir, e.Name()))
		formats = append(formats, format)
	}
	out := make([]loaded, len(files))
	chunks := (len(files) + chunk - 1) / chunk
	done := make(chan int, chunks)
	var next atomic.Int64
	// One clock for the whole read: a file written after it is racy (its
	// time is after now), one written within racyWindow before it too.
	now := c.clock()
	workers := runtime.GOMAXPROCS(0)
	if emit != nil && workers > 1 {
		// A CPU is left to whatever takes the peers as they come (the
		// kernel, taking them into a staging device).
		workers--
	}
	// readChunk reads and parses chunk ci's files into out.
	readChunk := func(ci int) {
		for i := ci * chunk; i < min((ci+1)*chunk, len(files)); i++ {
			// The identity is of what the name leads to now; a hit is a
			// file that was opened, checked and parsed before. A file the
			// cache does not know is not stat'ed first: the read's own
			// fstat gives its identity.
			if hit, found := c.get(files[i]); found && !hit.racy {
				if st, serr := d.Stat(names[i]); serr == nil && hit.id == idOf(st, opts) {
					out[i] = loaded{hit.p, hit.errs, hit.ignore}
					continue
				}
			}
			p, errs, ignore, st, ok := loadPeerFile(d, names[i], files[i], formats[i], opts)
			out[i] = loaded{p, errs, ignore}
			if ok {
				c.remember(files[i], idOf(st, opts), p, errs, ignore, now)
			}
		}
	}
	// One worker reads on this goroutine, a chunk before each claim: no
	// goroutine to wake and park again for every chunk.
	inline := workers <= 1
	if !inline {
		for range min(workers, chunks) {
			go func() {
				for ci := int(next.Add(1) - 1); ci < chunks; ci = int(next.Add(1) - 1) {
					readChunk(ci)
					done <- ci
				}
			}()
		}
	}
	var reg Contents
	taken := newClaims()
	lines, dropped, droppedFiles := 0, 0, 0
	claim := func(l loaded) {
		if l.ignore {
			return
		}
		errs := l.errs
		if len(errs) == 0 {
			errs = taken.claim(l.p)
		}
		if len(errs) == 0 {
			reg.Peers = append(reg.Peers, l.p)
			return
		}
		// Bounded per load as well as per file: a directory of thousands
		// of broken files is reported by its first ones and a count.
		if lines+len(errs) > MaxRegisterErrors {
			dropped += len(errs)
			droppedFiles++
			return
		}
		lines += len(errs)
		reg.Errors = append(reg.Errors, errs.Sorted())
	}
	// ready[ci]: chunk ci is read; claimed is how many chunks, from the
	// first, have been claimed.
	ready := make([]bool, chunks)
	claimed := 0
	for ci := range chunks {
		if inline {
			readChunk(ci)
			ready[ci] = true
		} else {
			ready[<-done] = true
		}
		from := len(reg.Peers)
		for ; claimed < chunks && ready[claimed]; claimed++ {
			for i := claimed * chunk; i < min((claimed+1)*chunk, len(files)); i++ {
				claim(out[i])
			}
		}
		if emit != nil && len(reg.Peers) > from {
			emit(reg.Peers[from:len(reg.Peers):len(reg.Peers)])
		}
	}
	c.keepOnly(dir, files)
	if droppedFiles > 0 {
		reg.Errors = append(reg.Errors, config.ErrorList{{File: dir, Msg: fmt.Sprintf("and %d more skipped file(s) with %d error(s), not listed", droppedFiles, dropped)}})
	}
	return reg
}

// File is one register file as LoadFile read it.
type File struct {
	Peer Peer
	// Errors are the file's own problems (it does not parse, validate or
	// pass the file checks); clashes with other files are the caller's.
	Errors config.ErrorList
	// Ignored: not a file the register reads (a dotfile, an editor's
	// backup, another extension, a directory).
	Ignored bool
	// Gone: no such file (removed, or renamed away).
	Gone bool
}

// LoadFile reads the one file name of dir as Load would, through the
// cache, checking nothing against the other files: what the daemon does
// when fsnotify names the file that changed, so that one changed peer
// among thousands costs one file's read.
func (c *Cache) LoadFile(dir, name string, opts config.Options) File {
	file := filepath.Join(dir, name)
	format := registerFormat(name)
	if format == "" || strings.ContainsRune(name, '/') {
		return File{Ignored: true}
	}
	d, err := fsafe.OpenDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			c.forget(file)
			return File{Gone: true}
		}
		return File{Errors: config.ErrorList{{File: dir, Msg: "cannot read the directory: " + cause(err)}}}
	}
	defer d.Close()
	st, serr := d.Stat(name)
	if errors.Is(serr, fs.ErrNotExist) || errors.Is(serr, unix.ENOENT) {
		c.forget(file)
		return File{Gone: true}
	}
	if hit, found := c.get(file); serr == nil && found && hit.id == idOf(st, opts) && !hit.racy {
		return File{Peer: hit.p, Errors: hit.errs, Ignored: hit.ignore}
	}
	p, errs, ignore, st, ok := loadPeerFile(d, name, file, format, opts)
	if ok {
		c.remember(file, idOf(st, opts), p, errs, ignore, c.clock())
	}
	return File{Peer: p, Errors: errs, Ignored: ignore}
}

// Error bounds: a register file is reported by at most MaxFileErrors
// errors and a count of the rest; a whole register by at most
// MaxRegisterErrors. Hostile or broken input (a file of YAML aliases)
// must not turn into megabytes of status and logs.
const (
	MaxFileErrors     = 20
	MaxRegisterErrors = 200
)

// Merge joins an interface's static peers (WireGuard.Peers, already
// validated with the config) with its register, by the rules Load
// applies between files: a public key, and an allowed prefix, belong to one
// peer only. Static peers win, because the config is the operator's
// deliberate word and a register file may be dropped in by anyone with
// write access to peersDir.
//
// It returns the static peers first, in order, as Peers with no
// File, then the register peers that clash with none of them, in order;
// and one error (an config.ErrorList) per register peer it left out, naming that
// peer's file and line and the static peer it clashes with. staticWhere
// names static peer i in those errors, like
// "nodeagent.yaml wireguard[1].peers[0]"; nil names it peers[i].
// reg.Errors are not repeated.
func Merge(static []config.WGPeer, staticWhere func(i int) string, reg Contents) ([]Peer, []error) {
	m, out := NewMerger(static, staticWhere)
	keep, errs := m.Add(reg.Peers)
	return append(out, keep...), errs
}

// Merger is Merge a batch of register peers at a time, for peers that
// come as LoadStream emits them: the static peers claim first, then each
// register peer in order, exactly as Merge claims them.
type Merger struct {
	taken  claims
	static int
}

// NewMerger returns a Merger holding the static peers' claims, and the
// static peers as Merge returns them (first, in order).
func NewMerger(static []config.WGPeer, staticWhere func(i int) string) (*Merger, []Peer) {
	if staticWhere == nil {
		staticWhere = func(i int) string { return config.IndexPath("peers", i) }
	}
	m := &Merger{taken: newClaims(), static: len(static)}
	out := make([]Peer, 0, len(static))
	for i, p := range static {
		m.taken.add(p, func(int) claimant { return claimant{name: staticWhere(i)} })
		out = append(out, Peer{Peer: p})
	}
	return m, out
}

// AddLoaded is Add for peers as Load (or LoadStream) gives them, which
// clash with none before them: a peer kept by Load claimed its key and
// prefixes in Load's own claims, so it can only clash with a static peer.
// Each is checked against the static peers alone, and nothing is
// recorded; with no static peers, peers are kept as they are.
func (m *Merger) AddLoaded(peers []Peer) ([]Peer, []error) {
	if m.static == 0 {
		return peers, nil
	}
	return keep(peers, m.taken.check)
}

// Add claims peers, the next register peers in order, and returns those
// kept and an error for each left out.
func (m *Merger) Add(peers []Peer) ([]Peer, []error) { return keep(peers, m.taken.claim) }

// keep returns the peers clash finds nothing against, and the clashes of
// the others.
func keep(peers []Peer, clash func(Peer) config.ErrorList) ([]Peer, []error) {
	out := make([]Peer, 0, len(peers))
	var errs []error
	for _, p := range peers {
		if e := clash(p); len(e) > 0 {
			errs = append(errs, e.Sorted())
			continue
		}
		out = append(out, p)
	}
	return out, errs
}

// claims remembers who holds each public key and allowed prefix: a
// register file and line, or a static peer's name.
type claims struct {
	keys    map[string]claimant
	allowed map[netip.Prefix]claimant
}

// claimant is who holds a claim, kept as parts: it is put into words only
// for a clash, which few claims ever meet.
type claimant struct {
	name string // a static peer's name, or the file
	line int    // the file's line; 0 for a static peer
}

func (c claimant) String() string {
	if c.line > 0 {
		return c.name + ":" + strconv.Itoa(c.line)
	}
	return c.name
}

func newClaims() claims {
	return claims{keys: map[string]claimant{}, allowed: map[netip.Prefix]claimant{}}
}

// add records p's key and prefixes where they are free; where(i) names
// p's allowed IP i, and where(-1) its key. Prefixes that do not parse are
// left out: validation has reported them.
func (c claims) add(p config.WGPeer, where func(i int) claimant) {
	if _, ok := c.keys[p.PublicKey]; !ok && p.PublicKey != "" {
		c.keys[p.PublicKey] = where(-1)
	}
	for i, s := range p.AllowedIPs {
		if pfx, err := netip.ParsePrefix(s); err == nil {
			if _, ok := c.allowed[pfx.Masked()]; !ok {
				c.allowed[pfx.Masked()] = where(i)
			}
		}
	}
}

// claim records p's key and prefixes, or, if any is taken, reports every
// clash and records nothing: a peer that is left out must not keep a later
// one out too.
func (c claims) claim(p Peer) config.ErrorList {
	errs := c.check(p)
	if len(errs) == 0 {
		c.add(p.Peer, func(i int) claimant { return claimant{p.File, max(p.line(i), 0)} })
	}
	return errs
}

// check reports every clash of p's key and prefixes with what is claimed,
// recording nothing.
func (c claims) check(p Peer) config.ErrorList {
	var errs config.ErrorList
	if first, dup := c.keys[p.Peer.PublicKey]; dup {
		errs = append(errs, &config.FieldError{File: p.File, Line: p.line(-1), Field: p.field(-1),
			Msg: "duplicate peer public key; first in " + first.String()})
	}
	for i, s := range p.Peer.AllowedIPs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			continue
		}
		if first, dup := c.allowed[pfx.Masked()]; dup {
			errs = append(errs, &config.FieldError{File: p.File, Line: p.line(i), Field: p.field(i),
				Msg: fmt.Sprintf("%s is already allowed for the peer in %s; WireGuard routes a prefix to one peer only", pfx.Masked(), first)})
		}
	}
	return errs
}

// line returns the line of p's allowed IP i, or of its key for i < 0.
func (p Peer) line(i int) int {
	switch {
	case i < 0 && p.KeyLine > 0:
		return p.KeyLine
	case i >= 0 && i < len(p.AllowedIPLines) && p.AllowedIPLines[i] > 0:
		return p.AllowedIPLines[i]
	}
	return p.Line
}

// field names p's allowed IP i, or its key for i < 0, as errors about
// p's file do.
func (p Peer) field(i int) string {
	path := "publicKey"
	if i >= 0 {
		path = config.IndexPath("allowedIPs", i)
	}
	if registerFormat(filepath.Base(p.File)) == "conf" {
		return wgQuickName(path)
	}
	return path
}

// Transient reports whether name is an editor's working file the register
// skips (a dotfile, a backup ending in ~), as opposed to a file it skips
// for its extension (a key file kept beside the peers, say).
func Transient(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasSuffix(name, "~")
}

// registerFormat returns "yaml" or "conf" for a file name the register
// reads, or "" for one it ignores.
func registerFormat(name string) string {
	if strings.HasPrefix(name, ".") || strings.HasSuffix(name, "~") {
		return ""
	}
	switch filepath.Ext(name) {
	case ".yaml", ".yml":
		return "yaml"
	case ".conf":
		return "conf"
	}
	return ""
}

// cause returns err without the operation and path an *fs.PathError adds,
// which the config.FieldError around it names already.
func cause(err error) string {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return pe.Err.Error()
	}
	if fe, ok := errors.AsType[*fsafe.Error](err); ok && fe.Err != nil {
		return fe.Err.Error()
	}
	return err.Error()
}

// peerFileRules are how a register file is opened: peersDir may be
// writable by others than root (a group that manages the VPN's users), so
// a file is read only if it is a regular file that others cannot write,
// reached without leaving the directory, and no bigger than a peer file
// can sensibly be.
var peerFileRules = fsafe.Rules{MaxSize: maxPeerFileSize}

// loadPeerFile reads and parses one register file. ignore is true for a
// directory behind a symlink, which the register passes over like any
// subdirectory. ok reports whether st is the identity of what was read
// (and so whether the result may be cached).
func loadPeerFile(d *fsafe.Dir, name, file, format string, opts config.Options) (p Peer, errs config.ErrorList, ignore bool, st unix.Stat_t, ok bool) {
	data, st, err := d.ReadFile(name, peerFileRules)
	switch {
	case errors.Is(err, fsafe.ErrIsDir):
		return Peer{}, nil, true, st, true
	case err != nil:
		// Not cached: what failed to open has no identity worth keeping,
		// and a file that was refused is looked at again next time.
		return Peer{}, config.ErrorList{{File: file, Msg: reason(err)}}, false, st, false
	}
	if format == "conf" {
		p, errs = parseWGQuickPeer(file, data, fs.FileMode(st.Mode&0o777), opts)
	} else {
		p, errs = parseYAMLPeer(file, data, opts)
	}
	return p, redactErrors(errs), false, st, true
}

// reason is an fsafe error's reason without the path, which the
// config.FieldError around it names already.
func reason(err error) string {
	if e, ok := errors.AsType[*fsafe.Error](err); ok {
		return e.Reason
	}
	return cause(err)
}

// Register errors may show a value or a key only when it has the shape of
// one: a field name, an address, a prefix, a host:port, a number or a
// WireGuard public key, and at most 64 bytes. Anything else is cut out,
// so that a register file holding something else entirely (another
// file's contents, copied or linked in) never has it printed back to
// whoever reads the status.
const maxShown = 64

var (
	quotedRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|` + "`[^`]*`")
	// The YAML parser's own messages quote with single quotes.
	yamlQuotedRE = regexp.MustCompile(`'[^']{2,}'`)
)

func keyShaped(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.[]", r)) {
			return false
		}
	}
	return true
}

func valueShaped(s string) bool {
	if len(s) > maxShown {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.:/[]+=%", r)) {
			return false
		}
	}
	return true
}

// redactErrors applies those rules to the errors of one register file.
func redactErrors(l config.ErrorList) config.ErrorList {
	for _, e := range l {
		switch {
		case e.Field == "":
		case !keyShaped(e.Field):
			e.Field = "(a key that is not a field name, not shown)"
		case len(e.Field) > maxShown:
			e.Field = e.Field[:maxShown] + "..."
		}
		re := quotedRE
		if strings.HasPrefix(e.Msg, "invalid YAML") {
			re = yamlQuotedRE
		}
		e.Msg = re.ReplaceAllStringFunc(e.Msg, func(q string) string {
			v := q[1 : len(q)-1]
			if q[0] == '"' {
				if u, err := strconv.Unquote(q); err == nil {
					v = u
				}
			}
			if valueShaped(v) {
				return q
			}
			return "(value not shown)"
		})
	}
	return l
}

// parseYAMLPeer decodes a YAML register file with the config's decoder,
// the file's top level standing for a config.WGPeer.
func parseYAMLPeer(file string, data []byte, opts config.Options) (Peer, config.ErrorList) {
	if peer, line, pf, ok := fastYAMLPeer(file, data); ok {
		// The fast path's peer, if it passes; a file it cannot vouch for
		// is read again by the full parser, whose errors are the ones
		// reported.
		if p, errs := registerPeer(pf, line, peer, "", opts); errs == nil {
			return p, nil
		}
	}
	peer, line, pf, errs := config.DecodePeerYAML(file, data, MaxFileErrors)
	if errs != nil {
		return Peer{}, errs
	}
	return registerPeer(pf, line, peer, "", opts)
}

// registerPeer validates the peer of a register file with the config's
// own peer check and, if it passes, returns it with its lines.
func registerPeer(pf *config.PeerFile, line int, peer config.WGPeer, psk Secret, opts config.Options) (Peer, config.ErrorList) {
	if errs := pf.Check(peer, opts); len(errs) > 0 {
		return Peer{}, errs
	}
	if peer.Name == "" {
		base := filepath.Base(pf.File)
		peer.Name = strings.TrimSuffix(base, filepath.Ext(base))
	}
	p := Peer{File: pf.File, Line: line, Peer: peer, PresharedKey: psk, KeyLine: pf.Lines.Line("publicKey")}
	for i := range peer.AllowedIPs {
		p.AllowedIPLines = append(p.AllowedIPLines, pf.Lines.Line(config.IndexPath("allowedIPs", i)))
	}
	return p, nil
}

// wgQuickKeys are the keys of a [Peer] stanza by their lowercase spelling,
// since wg(8) matches keys case-insensitively, with the path the peer
// check knows the field by.
var wgQuickKeys = map[string]struct{ name, path string }{
	"publickey":           {"PublicKey", "publicKey"},
	"presharedkey":        {"PresharedKey", ""},
	"endpoint":            {"Endpoint", "endpoint"},
	"allowedips":          {"AllowedIPs", "allowedIPs"},
	"persistentkeepalive": {"PersistentKeepalive", "persistentKeepalive"},
}

var wgQuickKeyNames = []string{"PublicKey", "PresharedKey", "Endpoint", "AllowedIPs", "PersistentKeepalive"}

// wgQuickName turns a peer field path into the wg-quick key it came from.
// Every AllowedIPs entry is AllowedIPs: the key may hold a list and may
// repeat, and the message names the prefix.
func wgQuickName(path string) string {
	if strings.HasPrefix(path, "allowedIPs[") {
		return "AllowedIPs"
	}
	for _, k := range wgQuickKeys {
		if k.path == path && path != "" {
			return k.name
		}
	}
	return path
}

// isKeyName reports whether s looks like a key name rather than a value,
// so an error may print it: a base64 key pasted on a line of its own must
// not be echoed as an "unknown key".
func isKeyName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') {
			return false
		}
	}
	return true
}

const (
	interfaceMsg = "an [Interface] section holds a machine's own private key, which must not sit in the register " +
		"(this looks like a client's wg-quick profile); remove this file, keep the private key on the client, " +
		"and write a [Peer] stanza with the client's public key instead"
	privateKeyMsg = "a private key does not belong in the register; PublicKey takes the peer's public key " +
		"(wg pubkey derives it), and the private key stays on the peer"
	unrecognizedMsg = "not Key = Value, a [Peer] header or a # comment (the line is not shown, in case it holds a key)"
)

// parseWGQuickPeer parses a wg-quick register file: one [Peer] stanza, read
// the way wg(8) reads it (case-insensitive keys, '#' comments anywhere,
// AllowedIPs a comma-separated list that may repeat, PersistentKeepalive a
// number or off). mode is the file's, for the inline PresharedKey.
//
// Nothing here prints a value that may be secret: not PresharedKey, not a
// line that does not parse, and an [Interface] section or PrivateKey ends
// or skips the read without looking at the key.
func parseWGQuickPeer(file string, data []byte, mode fs.FileMode, opts config.Options) (Peer, config.ErrorList) {
	var (
		errs     config.ErrorList
		dropped  int
		peer     config.WGPeer
		psk      Secret
		pskLine  int
		peerLine int
		section  string // "", "peer", or "?" for an unknown one
		first    = map[string]int{}
		pos      = config.Lines{}
		bad      = map[string]bool{}
	)
	errorf := func(line int, field, format string, args ...any) {
		if len(errs) >= MaxFileErrors {
			dropped++
			return
		}
		errs = append(errs, &config.FieldError{File: file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	list := func() config.ErrorList {
		if dropped > 0 {
			return append(errs, config.MoreErrors(file, dropped, "in this file")).Sorted()
		}
		return errs.Sorted()
	}
	data = bytes.TrimPrefix(data, []byte("\uFEFF")) // a byte order mark from a Windows editor
	for i, raw := range strings.Split(string(data), "\n") {
		ln := i + 1
		s, _, _ := strings.Cut(raw, "#")
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(s, "["); ok {
			name, closed := strings.CutSuffix(rest, "]")
			name = strings.TrimSpace(name)
			switch {
			case !closed:
				errorf(ln, "", "%s", unrecognizedMsg)
				section = "?"
			case strings.EqualFold(name, "Interface"):
				// Stop here: nothing after it is worth reading, and all
				// of it is near a private key.
				return Peer{}, config.ErrorList{{File: file, Line: ln, Field: "[Interface]", Msg: interfaceMsg}}
			case strings.EqualFold(name, "Peer") && peerLine != 0:
				errorf(ln, "[Peer]", "a second [Peer] stanza (the first is on line %d); a register file holds one peer, so give each its own file", peerLine)
				return Peer{}, list()
			case strings.EqualFold(name, "Peer"):
				peerLine, section = ln, "peer"
			default:
				field := ""
				if isKeyName(name) {
					field = "[" + name + "]"
				}
				errorf(ln, field, "unknown section; a register file holds one [Peer] stanza")
				section = "?"
			}
			continue
		}
		key, val, ok := strings.Cut(s, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		k, known := wgQuickKeys[strings.ToLower(key)]
		switch {
		case !ok || key == "":
			errorf(ln, "", "%s", unrecognizedMsg)
			continue
		case strings.EqualFold(key, "PrivateKey"):
			errorf(ln, "PrivateKey", "%s", privateKeyMsg)
			continue
		case !known && isKeyName(key):
			msg := "unknown key"
			if sug := config.Suggest(key, wgQuickKeyNames); sug != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", sug)
			}
			errorf(ln, key, "%s", msg)
			continue
		case !known:
			errorf(ln, "", "%s", unrecognizedMsg)
			continue
		case section == "?":
			continue // the section header is reported
		case section == "":
			errorf(ln, k.name, "outside a [Peer] section; start the stanza with [Peer]")
			continue
		case val == "":
			errorf(ln, k.name, "empty value")
			if k.name == "PublicKey" {
				bad[k.path] = true // it is reported; not "required" as well
			}
			continue
		}
		if k.name != "AllowedIPs" {
			if l, dup := first[k.name]; dup {
				errorf(ln, k.name, "duplicate key (first set on line %d)", l)
				continue
			}
			first[k.name] = ln
		}
		switch k.name {
		case "PublicKey":
			peer.PublicKey = val
			pos[k.path] = ln
		case "PresharedKey":
			if b, err := base64.StdEncoding.DecodeString(val); err != nil || len(b) != 32 {
				errorf(ln, k.name, "not a WireGuard key (32 bytes of base64, 44 characters ending in '='); the value is not shown, as it is secret")
				continue
			}
			psk, pskLine = Secret(val), ln
		case "Endpoint":
			peer.Endpoint = val
			pos[k.path] = ln
		case "AllowedIPs":
			for part := range strings.SplitSeq(val, ",") {
				part = strings.TrimSpace(part)
				if part == "" {
					errorf(ln, k.name, "empty entry in the list")
					continue
				}
				pos[config.IndexPath(k.path, len(peer.AllowedIPs))] = ln
				peer.AllowedIPs = append(peer.AllowedIPs, part)
			}
		case "PersistentKeepalive":
			pos[k.path] = ln
			if strings.EqualFold(val, "off") {
				continue
			}
			n, err := strconv.Atoi(val)
			if err != nil {
				errorf(ln, k.name, "%q is not a number of seconds (0-65535) or off", val)
				bad[k.path] = true
				continue
			}
			peer.PersistentKeepalive = n
		}
	}
	if peerLine == 0 {
		if len(errs) == 0 {
			errorf(0, "", "no [Peer] stanza; a register file holds one peer, as a [Peer] stanza or in YAML")
		}
		return Peer{}, list()
	}
	if psk != "" && !opts.SkipFileChecks && mode.Perm()&0o077 != 0 {
		errorf(pskLine, "PresharedKey", "this file holds a preshared key but is readable by group or others (mode %04o); chmod 600 it", mode.Perm())
	}
	pos[""] = peerLine
	pf := &config.PeerFile{File: file, Lines: pos, Bad: bad, Rename: wgQuickName, Errs: errs, MaxErrs: MaxFileErrors, Dropped: dropped}
	return registerPeer(pf, peerLine, peer, psk, opts)
}

func (c *Cache) clock() time.Time {
	if c == nil || c.now == nil {
		return time.Now()
	}
	return c.now()
}

// remember caches what reading file gave, id being what was read, at
// now: racy if it was modified less than racyWindow before now (or after).
func (c *Cache) remember(file string, id fileID, p Peer, errs config.ErrorList, ignore bool, now time.Time) {
	racy := now.Sub(time.Unix(0, max(id.mtime, id.ctime))) < racyWindow
	c.put(file, cachedPeerFile{id, p, errs, ignore, racy})
}

func (c *Cache) get(file string) (cachedPeerFile, bool) {
	if c == nil {
		return cachedPeerFile{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.files[file]
	return e, ok
}

func (c *Cache) put(file string, e cachedPeerFile) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.files == nil {
		c.files = map[string]cachedPeerFile{}
	}
	c.files[file] = e
}

func (c *Cache) forget(file string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.files, file)
}

// keepOnly forgets the files of dir that are gone.
func (c *Cache) keepOnly(dir string, files []string) {
	if c == nil {
		return
	}
	present := make(map[string]bool, len(files))
	for _, f := range files {
		present[f] = true
	}
	dir = filepath.Clean(dir)
	c.mu.Lock()
	defer c.mu.Unlock()
	for f := range c.files {
		if !present[f] && filepath.Dir(f) == dir {
			delete(c.files, f)
		}
	}
}
