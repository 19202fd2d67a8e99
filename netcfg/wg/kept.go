package wg

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Peers kept from an adoption. A device taken over with adopt: true may
// have peers in the kernel that its register does not name (added by the
// old setup after `nodeagent import` read the node, by a script, by hand).
// The adoption never removes them: it lists each (OpKeepPeer) and records
// it, so that later syncs of the device, now nodeagent's, leave it too. A
// kept peer stops being kept when its file joins the register (from then
// on the register manages it, and removing the file removes the peer) or
// when it leaves the kernel (the operator removed it with wg set); then
// OpForgetPeer records that. The record survives a restart: it is a file
// in the daemon's state directory (keptFile), root's alone.

// keptFile is the record under Handle.StateDir.
const keptFile = "wireguard/kept-peers.json"

// maxKeptFile bounds the record's size when it is read.
const maxKeptFile = 4 << 20

// keptStore is the record of kept peers, per device, read once.
type keptStore struct {
	mu     sync.Mutex
	loaded bool
	// peers maps a device to the public keys kept from its adoption.
	peers map[string]map[wgtypes.Key]bool
}

// keptPath is the record's path, "" when the handle keeps no state (a
// test, a one-shot without a state directory): then peers are kept for as
// long as the handle lives.
func (h *Handle) keptPath() string {
	if h.StateDir == "" {
		return ""
	}
	return filepath.Join(h.StateDir, keptFile)
}

// keptPeers returns a copy of the record, read from the state directory
// on first use. A record that cannot be read is taken as empty and said
// once in the log: its peers are then not kept apart, and the next
// adoption or forget writes it again.
func (h *Handle) keptPeers() map[string]map[wgtypes.Key]bool {
	h.kept.mu.Lock()
	defer h.kept.mu.Unlock()
	if !h.kept.loaded {
		h.kept.loaded = true
		h.kept.peers = map[string]map[wgtypes.Key]bool{}
		if p := h.keptPath(); p != "" {
			if err := readKept(p, h.kept.peers); err != nil && !errors.Is(err, fs.ErrNotExist) {
				h.log().Warn("peers kept from an adoption: record not read; none kept apart", "file", p, "err", err)
			}
		}
	}
	out := make(map[string]map[wgtypes.Key]bool, len(h.kept.peers))
	for dev, ks := range h.kept.peers {
		out[dev] = maps.Clone(ks)
	}
	return out
}

func readKept(path string, into map[string]map[wgtypes.Key]bool) error {
	b, err := fsafe.ReadFile(path, fsafe.Rules{MaxSize: maxKeptFile, Private: true, RootOwned: true})
	if err != nil {
		return err
	}
	var rec map[string][]string
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("not the record's JSON")
	}
	for dev, keys := range rec {
		for _, s := range keys {
			k, err := wgtypes.ParseKey(s)
			if err != nil {
				return fmt.Errorf("device %q: not a key", dev)
			}
			if into[dev] == nil {
				into[dev] = map[wgtypes.Key]bool{}
			}
			into[dev][k] = true
		}
	}
	return nil
}

// setKept records that peer k of dev is kept (on) or no longer (off), and
// writes the record (replaced whole, by rename, 0600 in a 0700
// directory).
func (h *Handle) setKept(dev string, k wgtypes.Key, on bool) error {
	h.keptPeers() // loaded
	h.kept.mu.Lock()
	defer h.kept.mu.Unlock()
	if on {
		if h.kept.peers[dev] == nil {
			h.kept.peers[dev] = map[wgtypes.Key]bool{}
		}
		h.kept.peers[dev][k] = true
	} else {
		delete(h.kept.peers[dev], k)
		if len(h.kept.peers[dev]) == 0 {
			delete(h.kept.peers, dev)
		}
	}
	p := h.keptPath()
	if p == "" {
		return nil
	}
	rec := map[string][]string{}
	for dev, ks := range h.kept.peers {
		for k := range ks {
			rec[dev] = append(rec[dev], k.String())
		}
		slices.Sort(rec[dev])
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("record of kept peers: %w", err)
	}
	if err := fsafe.WriteFile(p, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("record of kept peers: %w", err)
	}
	return nil
}

// ForgetKept removes the record of peers kept from adoptions under
// stateDir: nodeagent release hands the devices back, and no later sync
// of nodeagent's is to keep peers apart on them. A missing record is no
// error.
func ForgetKept(stateDir string) error {
	if stateDir == "" {
		return nil
	}
	err := os.Remove(filepath.Join(stateDir, keptFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
