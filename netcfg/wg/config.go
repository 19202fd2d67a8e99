package wg

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// FromConfig derives the desired state from a validated config, reading
// key files and every device's peer register (through reg, which may be
// nil, so an unchanged register file is not parsed again). It never fails
// as a whole:
// a device whose private key cannot be read is Broken, and a register
// entry (or static peer) that cannot be used is Skipped, each with the
// reason, so the other devices and peers are converged.
func FromConfig(c *config.Config, opts config.Options, reg *config.RegisterCache) Desired {
	var d Desired
	for i, w := range c.WireGuard {
		d.Devices = append(d.Devices, deviceFromConfig(c.File, i, w, opts, reg))
	}
	return d
}

func deviceFromConfig(file string, i int, w config.WireGuard, opts config.Options, cache *config.RegisterCache) Device {
	impl := w.Implementation
	if impl == "" {
		impl = ImplAuto
	}
	dev := Device{Name: w.Name, Impl: impl, ListenPort: w.ListenPort, FwMark: w.FwMark, MTU: w.MTU, Adopt: w.Adopt}
	for _, s := range w.Addresses {
		if p, err := netip.ParsePrefix(s); err == nil {
			dev.Addrs = append(dev.Addrs, p)
		}
	}
	if w.PrivateKeyFile == "" {
		dev.Broken = "no privateKeyFile"
	} else if k, err := ReadKeyFile(w.PrivateKeyFile); err != nil {
		dev.Broken = fmt.Sprintf("private key: %v", err)
	} else {
		dev.PrivateKey = k
	}
	var reg config.Register
	if w.PeersDir != "" {
		reg = cache.Load(w.PeersDir, opts)
	}
	peers, errs := config.MergePeers(w.Peers, func(j int) string {
		return fmt.Sprintf("%s: wireguard[%d].peers[%d]", file, i, j)
	}, reg)
	dev.KeepPeers = reg.Unreadable
	for _, err := range append(reg.Errors, errs...) {
		dev.Skipped = append(dev.Skipped, err.Error())
	}
	static := 0
	for _, rp := range peers {
		where := fmt.Sprintf("%s:%d", rp.File, rp.Line)
		if rp.File == "" {
			where = fmt.Sprintf("%s: wireguard[%d].peers[%d]", file, i, static)
			static++
		}
		p, err := peerFromConfig(rp)
		if err != nil {
			dev.Skipped = append(dev.Skipped, fmt.Sprintf("%s: %v", where, err))
			continue
		}
		dev.Peers = append(dev.Peers, p)
	}
	return dev
}

func peerFromConfig(rp config.RegisterPeer) (Peer, error) {
	c := rp.Peer
	k, err := wgtypes.ParseKey(c.PublicKey)
	if err != nil {
		return Peer{}, fmt.Errorf("publicKey: not a WireGuard key")
	}
	name := c.Name
	p := Peer{PublicKey: k, Name: name, Endpoint: c.Endpoint,
		Keepalive: time.Duration(c.PersistentKeepalive) * time.Second}
	switch {
	case c.PresharedKeyFile != "":
		if p.PresharedKey, err = ReadKeyFile(c.PresharedKeyFile); err != nil {
			return Peer{}, fmt.Errorf("presharedKeyFile: %w", err)
		}
	case rp.PresharedKey != "":
		if p.PresharedKey, err = ParseKey(rp.PresharedKey.Value()); err != nil {
			return Peer{}, fmt.Errorf("PresharedKey: %w", err)
		}
	}
	for _, s := range c.AllowedIPs {
		a, err := netip.ParsePrefix(s)
		if err != nil {
			return Peer{}, fmt.Errorf("allowedIPs: %q: %w", s, err)
		}
		p.AllowedIPs = append(p.AllowedIPs, a.Masked())
	}
	sortPrefixes(p.AllowedIPs)
	return p, nil
}

// maxKeyFile bounds what is read of a key file: a key is 45 bytes.
const maxKeyFile = 1024

// KeyFileRules are how key files are opened: not through a link, without
// blocking (a FIFO in its place must not wedge the daemon), a regular file
// owned by root that nobody else can read, and small.
var KeyFileRules = fsafe.Rules{MaxSize: maxKeyFile, Private: true, RootOwned: true}

// ReadKeyFile reads a key as wg genkey writes it, under KeyFileRules. No
// error repeats the file's contents.
func ReadKeyFile(path string) (Key, error) {
	b, err := fsafe.ReadFile(path, KeyFileRules)
	if err != nil {
		return Key{}, err
	}
	k, err := ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		return Key{}, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}
