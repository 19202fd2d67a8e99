// Package filecheck reads every file a config names as the daemon will
// read it, with the daemon's own readers (the same open without following
// links, fstat owner and mode checks and size caps), and reports each
// problem at the line of the field that names the file:
//
//	nodeagent.yaml:12: wireguard[0].privateKeyFile: /etc/nodeagent/keys/wg0.key does not exist
//
// validate and plan use it. The config's own validation looks at the
// config alone (and at a file's mode, where it can); this reads the files.
// No message quotes what a file holds.
package filecheck

import (
	"crypto/rsa"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/nodeagent/nodeagent/agent/kube"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/cred"
	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"golang.org/x/sys/unix"
)

// Options are where the daemon keeps what the files are checked against.
type Options struct {
	// StateDir is the daemon's state directory (pia.DefaultStateDir when
	// empty), which holds the cached PIA server lists.
	StateDir string
}

// Check reads the files c names. errs are what the daemon would fail on
// (a device left as it is, a tunnel never registered); warns are what it
// tolerates (a register directory not made yet, a kubeconfig k3s has not
// written yet) and what cannot be checked here (a file that only root may
// read, a PIA region while no server list is cached). Both are ordered by
// line.
func Check(c *config.Config, o Options) (errs, warns config.ErrorList) {
	k := &checker{c: c, root: os.Geteuid() == 0}
	for i, w := range c.WireGuard {
		p := fmt.Sprintf("wireguard[%d]", i)
		if w.PrivateKeyFile != "" {
			_, err := wg.ReadPrivateKeyFile(w.PrivateKeyFile)
			k.readRoots(p+".privateKeyFile", w.PrivateKeyFile, err)
		}
		for j, peer := range w.Peers {
			if peer.PresharedKeyFile != "" {
				_, err := wg.ReadKeyFile(peer.PresharedKeyFile)
				k.readRoots(fmt.Sprintf("%s.peers[%d].presharedKeyFile", p, j), peer.PresharedKeyFile, err)
			}
		}
		if w.PeersDir != "" {
			k.peersDir(p+".peersDir", w.PeersDir)
		}
		if w.PIA != nil {
			k.pia(p+".pia", *w.PIA, o)
		}
	}
	if f := c.Kubernetes.Kubeconfig; f != "" {
		k.kubeconfig("kubernetes.kubeconfig", f)
	}
	return sorted(k.errs), sorted(k.warns)
}

type checker struct {
	c           *config.Config
	root        bool
	errs, warns config.ErrorList
}

func (k *checker) at(field, format string, args ...any) *config.FieldError {
	return &config.FieldError{File: k.c.File, Line: k.c.Lines.Line(field), Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (k *checker) errorf(field, format string, args ...any) {
	k.errs = append(k.errs, k.at(field, format, args...))
}

func (k *checker) warnf(field, format string, args ...any) {
	k.warns = append(k.warns, k.at(field, format, args...))
}

// read reports the error of the daemon's read of the file field names. A
// file this process may not read is a warning when it is not root: the
// daemon is, and may read it.
func (k *checker) read(field string, err error) {
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrPermission) && !k.root:
		k.warnf(field, "%v; not checked (the daemon reads it as root: run validate as root to check it)", err)
	default:
		k.errorf(field, "%v", err)
	}
}

// readRoots is read for a file the daemon reads only when root owns it
// (keys and credentials). The readers accept a file of the user they run
// as, too: run as another user, validate holds the file to what the
// daemon, run as root, accepts.
func (k *checker) readRoots(field, path string, err error) {
	if err == nil && !k.root {
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil && st.Uid != 0 {
			err = fmt.Errorf("%s is owned by uid %d, not root; the daemon, which runs as root, refuses it (chown root it)", path, st.Uid)
		}
	}
	k.read(field, err)
}

// peersDir: a register directory that does not exist is an empty register
// to the daemon; one it cannot open keeps the peers it had.
func (k *checker) peersDir(field, dir string) {
	d, err := fsafe.OpenDir(dir)
	switch {
	case err == nil:
		d.Close()
	case errors.Is(err, fs.ErrNotExist):
		k.warnf(field, "%s does not exist; the device has no peers from a register until it is made", dir)
	default:
		k.read(field, err)
	}
}

// pia checks a PIA section's files and, against the cached server list,
// what the config's validation could not.
func (k *checker) pia(p string, s config.PIA, o Options) {
	if s.CredentialsFile != "" {
		_, err := cred.Read(s.CredentialsFile)
		k.readRoots(p+".credentialsFile", s.CredentialsFile, err)
	}
	if pf := s.PortForward; pf.Enabled && len(pf.OnChange) > 0 && strings.HasPrefix(pf.OnChange[0], "/") {
		field := p + ".portForward.onChange"
		for _, msg := range HookProblems(pf.OnChange[0]) {
			k.errorf(field, "%s", msg)
		}
		if f := HookCredentials(pf.OnChange); f != "" {
			_, err := cred.Read(f)
			if err != nil {
				err = fmt.Errorf("--credentials %w", err)
			}
			k.readRoots(field, f, err)
		}
	}
	for _, f := range []struct{ name, path string }{{"caFile", s.CAFile}, {"webCAFile", s.WebCAFile}} {
		if f.path != "" {
			_, err := pia.LoadRoots(f.path)
			k.read(p+"."+f.name, err)
		}
	}
	key := pia.DefaultListKey()
	if s.ServerListKeyFile != "" {
		var err error
		if key, err = pia.LoadListKey(s.ServerListKeyFile); err != nil {
			k.read(p+".serverListKeyFile", err)
			return // the list cannot be checked without its key
		}
	}
	if s.Region == "" || s.Region == "auto" {
		return
	}
	store := pia.StoreAt(o.StateDir)
	l, _, err := store.LoadList(ListURL(s), key)
	switch {
	case err != nil && errors.Is(err, fs.ErrPermission) && !k.root:
		k.warnf(p+".region", "%q cannot be checked: the cached PIA server list under %s cannot be read without root (run validate as root)", s.Region, store.Dir)
	case err != nil:
		k.warnf(p+".region", "%q cannot be checked: the cached PIA server list under %s: %v", s.Region, store.Dir, err)
	case l == nil:
		k.warnf(p+".region", "%q cannot be checked: no PIA server list is cached under %s yet (nodeagent run fetches it; then validate checks the region and nodeagent regions lists them)", s.Region, store.Dir)
	}
	// With a list, the config's validation judged the region already
	// (Region): a config that reached here has a known one.
}

// maxKubeconfig bounds what is read of a kubeconfig: k3s writes a few KiB.
const maxKubeconfig = 16 << 20

// kubeconfig: the labeller reads the file at each connection attempt,
// following links, since at cold boot k3s has not written it yet.
func (k *checker) kubeconfig(field, path string) {
	b, err := fsafe.ReadFile(path, fsafe.Rules{MaxSize: maxKubeconfig, FollowLinks: true})
	switch {
	case errors.Is(err, fs.ErrNotExist):
		k.warnf(field, "%s does not exist (yet); nodeagent labels the Node once it does", path)
		return
	case err != nil:
		k.read(field, err)
		return
	}
	// The file holds credentials: a parse error is not quoted.
	if kube.ServerOf(b) == "" {
		k.errorf(field, "%s is not a kubeconfig (YAML with clusters[].cluster.server)", path)
	}
}

// ListURL is the URL of a PIA section's server list.
func ListURL(s config.PIA) string {
	if s.ServerList != "" {
		return s.ServerList
	}
	return pia.DefaultServerList
}

// ListKey is the key a PIA section's server list is signed with.
func ListKey(s config.PIA) (*rsa.PublicKey, error) {
	if s.ServerListKeyFile == "" {
		return pia.DefaultListKey(), nil
	}
	return pia.LoadListKey(s.ServerListKeyFile)
}

func sorted(l config.ErrorList) config.ErrorList {
	if len(l) == 0 {
		return nil
	}
	return l.Sorted()
}

// SuggestRegion is the region id of l that id is a plausible typo of (a
// letter or two wrong, missing, extra or swapped, or the id without its
// country: amsterdam for nl_amsterdam), or "".
func SuggestRegion(l *pia.List, id string) string {
	if l == nil {
		return ""
	}
	best, bestDist := "", -1
	var within []string
	g := strings.ToLower(id)
	for _, r := range l.Regions {
		c := strings.ToLower(r.ID)
		if d := osaDistance(g, c); bestDist < 0 || d < bestDist {
			best, bestDist = r.ID, d
		}
		if strings.HasSuffix(c, "_"+g) || strings.HasPrefix(c, g+"_") {
			within = append(within, r.ID)
		}
	}
	if limit := min(max(len(id)/3, 1), 3); bestDist >= 0 && bestDist <= limit {
		return best
	}
	if len(within) == 1 {
		return within[0]
	}
	return ""
}

// osaDistance is the optimal string alignment distance between a and b:
// Levenshtein's, with two adjacent letters swapped counting as one edit.
func osaDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b))
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
