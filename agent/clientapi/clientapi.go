// Package clientapi serves the remote-access clients' endpoints of the
// local API (nodeagentctl peer add|disable|enable|remove): it chooses the
// address, writes or edits the peer file in the device's register, and
// waits until the daemon has applied it. The daemon's file watch applies
// a register file as it applies any other (netcfg.ApplyPeerFiles); this
// package never writes the kernel.
//
// Changes of one daemon's registers are serialized (a mutex, and a flock
// on the register directory for anyone else who takes it), so that two
// concurrent adds never choose one address; a file is created under its
// name with link(2), so two never take one name.
package clientapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/nodeagent/nodeagent/agent/api"
	"github.com/nodeagent/nodeagent/netcfg/clients"
	"github.com/nodeagent/nodeagent/netcfg/config"
)

// DefaultApplyWait is how long a change waits for the daemon to apply it.
const DefaultApplyWait = 30 * time.Second

// Manager serves the endpoints for a daemon.
type Manager struct {
	// status is the daemon's status: what the waits read.
	status func() api.Status
	log    *slog.Logger
	// ApplyWait bounds the wait for the daemon (DefaultApplyWait).
	ApplyWait time.Duration
	// Now is the clock (time.Now).
	Now func() time.Time

	cfg atomic.Pointer[config.Config]
	// mu serializes the changes of the registers.
	mu sync.Mutex
}

// New returns a Manager reading the daemon's status with status.
func New(status func() api.Status, log *slog.Logger) *Manager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{status: status, log: log, ApplyWait: DefaultApplyWait, Now: time.Now}
}

// SetConfig gives the running config (the daemon's loop calls it at each
// load).
func (m *Manager) SetConfig(c *config.Config) { m.cfg.Store(c) }

// Error is a refusal with its HTTP status.
type Error struct {
	Code int
	Msg  string
}

func (e *Error) Error() string   { return e.Msg }
func (e *Error) HTTPStatus() int { return e.Code }

func fail(code int, format string, args ...any) error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// device finds the device a request names, or the only one with clients.
func (m *Manager) device(name string) (*config.Config, int, error) {
	c := m.cfg.Load()
	if c == nil {
		return nil, 0, fail(http.StatusServiceUnavailable, "the config is not loaded yet")
	}
	if name != "" {
		for i, w := range c.WireGuard {
			if w.Name == name {
				if w.PIA != nil || w.PeersDir == "" {
					return nil, 0, fail(http.StatusBadRequest, "%s has no peersDir (a PIA tunnel has no clients of its own)", name)
				}
				return c, i, nil
			}
		}
		return nil, 0, fail(http.StatusNotFound, "no WireGuard device %q in %s", clip(name), c.File)
	}
	var with, dirs []int
	for i, w := range c.WireGuard {
		if w.PIA == nil && w.PeersDir != "" {
			dirs = append(dirs, i)
			if w.Clients != nil {
				with = append(with, i)
			}
		}
	}
	switch {
	case len(with) == 1:
		return c, with[0], nil
	case len(with) > 1:
		return nil, 0, fail(http.StatusBadRequest, "several devices have clients (%s); name one with --device", names(c, with))
	case len(dirs) == 1:
		return c, dirs[0], nil
	case len(dirs) > 1:
		return nil, 0, fail(http.StatusBadRequest, "several devices have a peersDir (%s); name one with --device", names(c, dirs))
	}
	return nil, 0, fail(http.StatusConflict, "no WireGuard device in %s has a peersDir for clients", c.File)
}

func names(c *config.Config, idx []int) string {
	var out []string
	for _, i := range idx {
		out = append(out, c.WireGuard[i].Name)
	}
	return strings.Join(out, ", ")
}

// Add adds a client. It writes nothing unless it can be applied as asked:
// a name in use, a full subnet, a device without clients.endpoint are
// refused first.
func (m *Manager) Add(ctx context.Context, req api.PeerAdd) (api.PeerAdded, error) {
	c, i, err := m.device(req.Device)
	if err != nil {
		return api.PeerAdded{}, err
	}
	w := c.WireGuard[i]
	if err := clients.CheckName(req.Name); err != nil {
		return api.PeerAdded{}, fail(http.StatusBadRequest, "%v", err)
	}
	if err := clients.CheckDescription(req.Description); err != nil {
		return api.PeerAdded{}, fail(http.StatusBadRequest, "%v", err)
	}
	key, err := wgtypes.ParseKey(req.PublicKey)
	if err != nil {
		return api.PeerAdded{}, fail(http.StatusBadRequest, "publicKey: not a WireGuard public key")
	}
	cl := w.Clients
	if cl == nil || cl.Endpoint == "" {
		return api.PeerAdded{}, fail(http.StatusConflict, "%s has no clients.endpoint in %s: the host:port clients dial (the router's forward to listenPort %d), like\n  clients: {endpoint: vpn.example.org:%d}\nnothing was written", w.Name, c.File, w.ListenPort, max(w.ListenPort, 51820))
	}
	now := m.Now()
	var expires time.Time
	if req.Expires != "" {
		if expires, err = clients.ParseExpiry(req.Expires, now); err != nil {
			return api.PeerAdded{}, fail(http.StatusBadRequest, "expires: %v", err)
		}
	}
	if req.Via != "" && !req.FullTunnel {
		return api.PeerAdded{}, fail(http.StatusBadRequest, "--via %s needs --full-tunnel: without it the client sends only %s into the tunnel, and its internet never reaches %s", req.Via, w.Name, req.Via)
	}
	var want []netip.Addr
	for _, s := range req.IPs {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil {
			return api.PeerAdded{}, fail(http.StatusBadRequest, "--ip %q is not an address", clip(s))
		}
		want = append(want, a)
	}
	dev := clients.Device{Name: w.Name}
	for _, s := range w.Addresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			dev.Addrs = append(dev.Addrs, p)
		}
	}
	for _, e := range cl.Egress {
		if p, err := netip.ParsePrefix(e.Pool); err == nil {
			dev.Pools = append(dev.Pools, clients.Pool{Prefix: p.Masked(), Via: e.Via})
		}
	}

	file, addrs, err := m.write(w, dev, key, req, want, expires, now)
	if err != nil {
		return api.PeerAdded{}, err
	}
	st, err := m.waitFor(ctx, w.Name, file, func(d api.WireGuardDevice) (bool, string) {
		p := findPeer(d, key.String())
		return p != nil && p.State == "", ""
	})
	if err != nil {
		// Nothing half-applied: the file goes, and with it whatever the
		// daemon made of it.
		if rerr := clients.Remove(file); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			m.log.Warn("peer add: removing the file it wrote", "file", file, "err", rerr)
		}
		return api.PeerAdded{}, fail(http.StatusServiceUnavailable, "%v; %s was removed again", err, file)
	}
	res := api.PeerAdded{Device: w.Name, Name: req.Name, File: file, ServerPublicKey: st.PublicKey, Endpoint: cl.Endpoint,
		PersistentKeepalive: cl.ClientKeepalive(), MTU: w.MTU, Via: req.Via}
	for _, a := range addrs {
		res.Addresses = append(res.Addresses, a.String())
	}
	switch {
	case req.FullTunnel:
		res.AllowedIPs = slices.Clone(clients.FullTunnel)
	case len(cl.AllowedIPs) > 0:
		res.AllowedIPs = slices.Clone(cl.AllowedIPs)
	default:
		for _, p := range dev.Addrs {
			res.AllowedIPs = append(res.AllowedIPs, p.Masked().String())
		}
	}
	res.DNS = slices.Clone(cl.DNS)
	for _, e := range cl.Egress {
		if e.Via == req.Via && req.Via != "" && len(e.DNS) > 0 {
			res.DNS = slices.Clone(e.DNS)
		}
	}
	if !expires.IsZero() {
		res.Expires = &expires
	}
	return res, nil
}

// write chooses the addresses and creates the file, under the register's
// lock: the next add sees this one's file.
func (m *Manager) write(w config.WireGuard, dev clients.Device, key wgtypes.Key, req api.PeerAdd, want []netip.Addr, expires, now time.Time) (string, []netip.Prefix, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := os.MkdirAll(w.PeersDir, 0o755); err != nil {
		return "", nil, fail(http.StatusInternalServerError, "peersDir %s: %v", w.PeersDir, err)
	}
	unlock, err := clients.Lock(w.PeersDir)
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	inv, err := clients.Take(w.PeersDir, w.Peers)
	if err != nil {
		return "", nil, err
	}
	if where, used := inv.Names[req.Name]; used {
		return "", nil, fail(http.StatusConflict, "the name %s is in use (%s); choose another, or remove that peer first (nothing was written)", req.Name, where)
	}
	for _, p := range inv.Peers {
		if p.Peer.PublicKey == key.String() {
			return "", nil, fail(http.StatusConflict, "that public key is %s's already (%s)", p.Peer.Name, p.File)
		}
	}
	for i, p := range w.Peers {
		if p.PublicKey == key.String() {
			return "", nil, fail(http.StatusConflict, "that public key is the config's peers[%d]", i)
		}
	}
	addrs, err := clients.Allocate(dev, inv.Used, req.Via, want)
	if err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, clients.ErrFull) {
			code = http.StatusConflict
		}
		return "", nil, fail(code, "%v (nothing was written)", err)
	}
	data := clients.File{Description: req.Description, PublicKey: key.String(), AllowedIPs: addrs, Expires: expires, Via: req.Via, Added: now}.YAML()
	file, err := clients.Create(w.PeersDir, req.Name, data)
	switch {
	case errors.Is(err, clients.ErrExists):
		return "", nil, fail(http.StatusConflict, "the name %s is in use (%s)", req.Name, filepath.Join(w.PeersDir, req.Name+".yaml"))
	case errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EROFS):
		return "", nil, fail(http.StatusInternalServerError, "cannot write into peersDir %s (%v): the daemon needs write access there (nodeagent.service allows /etc/nodeagent/peers.d; a peersDir elsewhere needs ReadWritePaths= in a drop-in)", w.PeersDir, err)
	case err != nil:
		return "", nil, fail(http.StatusInternalServerError, "writing %s: %v", req.Name, err)
	}
	m.log.Info("peer file written", "device", w.Name, "name", req.Name, "file", file)
	return file, addrs, nil
}

// Change disables, enables or removes a client of the register.
func (m *Manager) Change(ctx context.Context, action string, req api.PeerChange) (api.PeerChanged, error) {
	if action != "disable" && action != "enable" && action != "remove" {
		return api.PeerChanged{}, fail(http.StatusNotFound, "no such action %q", clip(action))
	}
	if err := clients.CheckName(req.Name); err != nil {
		return api.PeerChanged{}, fail(http.StatusBadRequest, "%v", err)
	}
	c, i, err := m.deviceOf(req)
	if err != nil {
		return api.PeerChanged{}, err
	}
	w := c.WireGuard[i]
	file, key, changed, err := m.edit(w, action, req.Name)
	if err != nil {
		return api.PeerChanged{}, err
	}
	res := api.PeerChanged{Device: w.Name, Name: req.Name, File: file, Changed: changed, State: map[string]string{"disable": clients.StateDisabled, "enable": clients.StateActive, "remove": "removed"}[action]}
	if key == "" {
		return res, nil // a file that did not read: nothing of it is in the device
	}
	_, err = m.waitFor(ctx, w.Name, "", func(d api.WireGuardDevice) (bool, string) {
		p := findPeer(d, key)
		switch action {
		case "enable":
			if p != nil && p.State == clients.StateExpired {
				return true, clients.StateExpired
			}
			return p != nil && p.State == "", ""
		case "disable":
			return p != nil && p.State == clients.StateDisabled, ""
		}
		return p == nil, ""
	})
	if err != nil {
		return res, fail(http.StatusServiceUnavailable, "%s %s: %s is written, but %v", action, req.Name, file, err)
	}
	if action == "enable" {
		if d := m.deviceStatus(w.Name); d != nil {
			if p := findPeer(*d, key); p != nil && p.State == clients.StateExpired {
				res.State = clients.StateExpired
				return res, fail(http.StatusConflict, "%s is enabled but has expired (%s): it stays out until its expires is moved (edit %s)", req.Name, p.Reason, file)
			}
		}
	}
	return res, nil
}

// deviceOf finds the device a change names, or the one whose register
// holds the name.
func (m *Manager) deviceOf(req api.PeerChange) (*config.Config, int, error) {
	if req.Device != "" {
		return m.device(req.Device)
	}
	c := m.cfg.Load()
	if c == nil {
		return nil, 0, fail(http.StatusServiceUnavailable, "the config is not loaded yet")
	}
	var found []int
	for i, w := range c.WireGuard {
		if w.PIA != nil || w.PeersDir == "" {
			continue
		}
		for _, ext := range []string{".yaml", ".yml", ".conf"} {
			if _, err := os.Lstat(filepath.Join(w.PeersDir, req.Name+ext)); err == nil {
				found = append(found, i)
				break
			}
		}
	}
	switch len(found) {
	case 1:
		return c, found[0], nil
	case 0:
		// A peer named in its file rather than by the file's name.
		return m.device("")
	}
	return nil, 0, fail(http.StatusBadRequest, "%s is a peer of several devices (%s); name one with --device", req.Name, names(c, found))
}

// edit changes the register file of name under the register's lock and
// returns the file and the peer's public key ("" for a file that does not
// read).
func (m *Manager) edit(w config.WireGuard, action, name string) (file, key string, changed bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	unlock, err := clients.Lock(w.PeersDir)
	if err != nil {
		return "", "", false, err
	}
	defer unlock()
	for i, p := range w.Peers {
		if p.Name == name {
			return "", "", false, fail(http.StatusConflict, "%s is the config's wireguard %s peers[%d], not a register file: edit %s", name, w.Name, i, m.cfg.Load().File)
		}
	}
	inv, err := clients.Take(w.PeersDir, nil)
	if err != nil {
		return "", "", false, err
	}
	for _, p := range inv.Peers {
		if p.Peer.Name == name {
			file, key = p.File, p.Peer.PublicKey
		}
	}
	if file == "" {
		where, ok := inv.Names[name]
		if !ok || action != "remove" {
			if ok {
				return "", "", false, fail(http.StatusConflict, "%s does not read as a peer (nodeagentctl status lists why); fix or remove it", where)
			}
			return "", "", false, fail(http.StatusNotFound, "no peer %s in %s", name, w.PeersDir)
		}
		file = where
	}
	switch action {
	case "remove":
		err, changed = clients.Remove(file), true
	default:
		changed, err = clients.SetDisabled(file, action == "disable")
	}
	if err != nil {
		return "", "", false, fail(http.StatusConflict, "%v", err)
	}
	m.log.Info("peer file changed", "device", w.Name, "name", name, "file", file, "action", action, "changed", changed)
	return file, key, changed, nil
}

// pollEvery is how often a wait looks at the status.
const pollEvery = 20 * time.Millisecond

// waitFor waits until done holds for device dev in the status, a sync
// reports file skipped (its error is returned), or the wait runs out.
func (m *Manager) waitFor(ctx context.Context, dev, file string, done func(api.WireGuardDevice) (bool, string)) (api.WireGuardDevice, error) {
	ctx, cancel := context.WithTimeout(ctx, m.ApplyWait)
	defer cancel()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		st := m.status()
		for _, d := range st.WireGuard {
			if d.Name == dev {
				if ok, _ := done(d); ok {
					return d, nil
				}
			}
		}
		if file != "" {
			for _, o := range append(st.Skipped, st.Failed...) {
				if strings.Contains(o.Message, file) {
					return api.WireGuardDevice{}, fmt.Errorf("the daemon did not apply it: %s", o.Message)
				}
			}
		}
		select {
		case <-ctx.Done():
			return api.WireGuardDevice{}, fmt.Errorf("the daemon did not apply it within %s (nodeagentctl status says why)", m.ApplyWait)
		case <-t.C:
		}
	}
}

func (m *Manager) deviceStatus(dev string) *api.WireGuardDevice {
	st := m.status()
	for i := range st.WireGuard {
		if st.WireGuard[i].Name == dev {
			return &st.WireGuard[i]
		}
	}
	return nil
}

func findPeer(d api.WireGuardDevice, key string) *api.WireGuardPeer {
	for i := range d.Peers {
		if d.Peers[i].PublicKey == key {
			return &d.Peers[i]
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
