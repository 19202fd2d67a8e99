package clients

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/nodeagent/nodeagent/netcfg/register"
)

// nameRE is a client's name: its file is NAME.yaml, and it is a label
// value in the metrics, so it is kept to what both take.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// CheckName reports whether name can name a client.
func CheckName(name string) error {
	if !nameRE.MatchString(name) || strings.HasSuffix(name, ".") {
		return fmt.Errorf("%q is not a client name: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", clip(name))
	}
	for _, ext := range []string{".yaml", ".yml", ".conf"} {
		if strings.HasSuffix(name, ext) {
			return fmt.Errorf("%q: give the name without %s (the file is NAME.yaml)", clip(name), ext)
		}
	}
	return nil
}

// maxDescription bounds a description, which status and peers print.
const maxDescription = 200

// CheckDescription reports whether s can be a peer's description: one
// line of printable text.
func CheckDescription(s string) error {
	if len(s) > maxDescription {
		return fmt.Errorf("description: longer than %d bytes", maxDescription)
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f {
			return fmt.Errorf("description: holds a control character (one line of text)")
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Inventory is what a device's register and config hold: the names in
// use and the prefixes its peers are allowed.
type Inventory struct {
	// Names are the names in use: every register file's (its name
	// without the extension, whether or not it reads), and every peer's
	// name.
	Names map[string]string // name -> where
	// Used are the allowed prefixes of every peer, held ones included.
	Used []netip.Prefix
	// Peers are the register's peers that read.
	Peers []register.Peer
}

// Take reads dir, the device's register, and static, its peers in the
// config. A register that cannot be read is an error: nothing can be
// added next to what is not known.
func Take(dir string, static []config.WGPeer) (Inventory, error) {
	inv := Inventory{Names: map[string]string{}}
	for i, p := range static {
		if p.Name != "" {
			inv.Names[p.Name] = fmt.Sprintf("the config's peers[%d]", i)
		}
		inv.Used = appendPrefixes(inv.Used, p.AllowedIPs)
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return inv, fmt.Errorf("peersDir %s: %w", dir, err)
	}
	for _, e := range entries {
		n := e.Name()
		if register.Transient(n) {
			continue
		}
		switch ext := filepath.Ext(n); ext {
		case ".yaml", ".yml", ".conf":
			inv.Names[strings.TrimSuffix(n, ext)] = filepath.Join(dir, n)
		}
	}
	reg := register.Load(dir, config.Options{})
	if reg.Unreadable {
		return inv, fmt.Errorf("peersDir %s cannot be read", dir)
	}
	for _, p := range reg.Peers {
		inv.Names[p.Peer.Name] = p.File
		inv.Used = appendPrefixes(inv.Used, p.Peer.AllowedIPs)
	}
	inv.Peers = reg.Peers
	return inv, nil
}

func appendPrefixes(out []netip.Prefix, ss []string) []netip.Prefix {
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// File is a client's peer file as peer add writes it.
type File struct {
	Description string
	PublicKey   string
	AllowedIPs  []netip.Prefix
	// Expires is when the peer leaves the device (zero: never).
	Expires time.Time
	// Via is the device the client's internet leaves by (a comment: the
	// address's pool is what routes it).
	Via string
	// Added is when it was written.
	Added time.Time
}

// YAML is the file's content, in the register's YAML form.
func (f File) YAML() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# written by nodeagentctl peer add at %s; the client's private key is not kept here\n", f.Added.UTC().Format(time.RFC3339))
	if f.Via != "" {
		fmt.Fprintf(&b, "# its internet leaves by %s (the address is in that device's clients.egress pool)\n", f.Via)
	}
	if f.Description != "" {
		fmt.Fprintf(&b, "description: %s\n", yamlString(f.Description))
	}
	fmt.Fprintf(&b, "publicKey: %s\n", f.PublicKey)
	var ips []string
	for _, p := range f.AllowedIPs {
		ips = append(ips, p.String())
	}
	fmt.Fprintf(&b, "allowedIPs: [%s]\n", strings.Join(ips, ", "))
	if !f.Expires.IsZero() {
		fmt.Fprintf(&b, "expires: %s\n", f.Expires.UTC().Format(time.RFC3339))
	}
	return b.Bytes()
}

// plainRE is a description YAML reads as the same string unquoted (and
// the register's fast path reads).
var plainRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9 ._()]*$`)

// yamlString is s as a YAML scalar: plain where that reads back as s, else
// double-quoted (JSON's escapes are YAML's).
func yamlString(s string) string {
	if plainRE.MatchString(s) && !strings.Contains(s, "  ") && !strings.HasSuffix(s, " ") && len(s) > 5 {
		return s
	}
	q, _ := json.Marshal(s)
	return string(q)
}

// FileMode is the mode of the files peer add writes: no key in them, but a
// description may say whose device it is.
const FileMode = 0o640

// ErrExists is the error of a Create whose name is taken.
var ErrExists = errors.New("exists")

// Create writes data as dir/name.yaml, atomically and never over an
// existing file: the content goes to a temporary file, which is synced and
// then linked to the name (link(2) fails if the name exists, so two
// writers can never both succeed), and the directory synced. The register
// ignores the temporary file (a dotfile).
func Create(dir, name string, data []byte) (string, error) {
	path := filepath.Join(dir, name+".yaml")
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".nodeagent-"+name+"-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, FileMode)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Chmod(FileMode); err != nil { // the umask took bits off
		f.Close()
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("%s: %w", path, ErrExists)
		}
		return "", err
	}
	return path, syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Lock takes an exclusive lock on dir (flock on the directory itself), so
// that no two changes of one register interleave, whoever makes them. It
// returns the unlock.
func Lock(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("peersDir %s: %w", dir, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("peersDir %s: lock: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// SetDisabled writes disabled: true into file, a YAML register file, or
// takes it out (disabled false), changing nothing else in it: the line of
// a top-level disabled key is dropped, and disabled: true appended. The
// file is replaced atomically, keeping its mode. A wg-quick file (.conf)
// has no such field, and is refused. changed is false when the file
// already said so.
func SetDisabled(file string, disabled bool) (changed bool, err error) {
	if filepath.Ext(file) == ".conf" {
		return false, fmt.Errorf("%s is a wg-quick [Peer] stanza, which has no disabled field: write the peer as YAML (publicKey, allowedIPs) to disable it, or remove it", file)
	}
	data, st, err := readRegisterFile(file)
	if err != nil {
		return false, err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil || root.Kind != yaml.DocumentNode || len(root.Content) != 1 {
		return false, fmt.Errorf("%s does not read as a peer file; fix it first (nodeagentctl status lists its errors)", file)
	}
	m := root.Content[0]
	if m.Kind != yaml.MappingNode || m.Style&yaml.FlowStyle != 0 {
		return false, fmt.Errorf("%s is not a block mapping of peer fields; edit it by hand", file)
	}
	lines := strings.SplitAfter(string(data), "\n")
	drop := -1
	now := false
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Value != "disabled" {
			continue
		}
		if v.Kind != yaml.ScalarNode || v.Line != k.Line || k.Column != 1 {
			return false, fmt.Errorf("%s: its disabled field is not a plain true or false on one line; edit it by hand", file)
		}
		drop = k.Line - 1
		now = strings.EqualFold(v.Value, "true")
	}
	if now == disabled && (drop >= 0 || !disabled) {
		return false, nil
	}
	var b strings.Builder
	for i, l := range lines {
		if i != drop {
			b.WriteString(l)
		}
	}
	out := b.String()
	if disabled {
		if out != "" && !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		out += "disabled: true\n"
	}
	// What is written must read as the same peer, now (not) disabled.
	peer, _, pf, errs := config.DecodePeerYAML(file, []byte(out), 5)
	if errs == nil {
		errs = pf.Check(peer, config.Options{SkipFileChecks: true})
	}
	if errs != nil || peer.Disabled != disabled {
		return false, fmt.Errorf("%s: the edited file would not read back (%v); edit it by hand", file, errs)
	}
	return true, writeKeeping(file, []byte(out), st)
}

// readRegisterFile reads a register file as the register does (no link
// followed out of its directory, regular, others cannot write, capped).
func readRegisterFile(file string) ([]byte, unix.Stat_t, error) {
	d, err := fsafe.OpenDir(filepath.Dir(file))
	if err != nil {
		return nil, unix.Stat_t{}, err
	}
	defer d.Close()
	return d.ReadFile(filepath.Base(file), fsafe.Rules{MaxSize: 64 << 10})
}

// writeKeeping replaces file with data atomically, with st's mode, owner
// and group.
func writeKeeping(file string, data []byte, st unix.Stat_t) error {
	dir := filepath.Dir(file)
	f, err := os.CreateTemp(dir, ".nodeagent-edit-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(fs.FileMode(st.Mode & 0o777))
	}
	if err == nil {
		err = f.Chown(int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(f.Name(), file); err != nil {
		return err
	}
	return syncDir(dir)
}

// Remove deletes a register file.
func Remove(file string) error {
	if err := os.Remove(file); err != nil {
		return err
	}
	return syncDir(filepath.Dir(file))
}
