package pia

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// DefaultStateDir is where the daemon keeps its state; a provider's is
// under its pia/ subdirectory.
const DefaultStateDir = "/var/lib/nodeagent"

// Store keeps a provider's state on disk, in Dir (STATEDIR/pia), mode
// 0700, every file 0600 and written atomically:
//
//	<device>.json  the registration and the token (secret)
//	<device>.key   the device's private key, when nodeagent generated it
//	list-<h>.txt   the last good server list of the URL hashing to h, as
//	               signed (it is checked again when read back)
type Store struct{ Dir string }

// StoreAt is the store under the state directory stateDir.
func StoreAt(stateDir string) Store {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	return Store{Dir: filepath.Join(stateDir, "pia")}
}

// MaxStateSize bounds a device's state file: what Save writes, and what
// Load reads back. One cap for both, so a state that was written can
// always be read at the next start. (What goes in is bounded well below
// it: a token of 1 KiB at most, a payload and a signature of 2 KiB each,
// at most MaxDNSServers resolvers, a cn and a region id of a few dozen
// characters.)
const MaxStateSize = 64 << 10

// stateRules are how state files are read: regular, not a link, root's,
// private and small.
var stateRules = fsafe.Rules{MaxSize: MaxStateSize, Private: true, RootOwned: true}

// Saved is what a provider persists.
type Saved struct {
	// Token is the last token and when it was issued.
	Token   Secret
	TokenAt time.Time
	// Reg is the registration the device runs with; nil when none.
	Reg *Registration
	// PF is the port forwarding's state; nil when none.
	PF *SavedPF
}

// SavedPF is port forwarding's persisted state.
type SavedPF struct {
	// Sig is the signature in use (its payload and signature are secret).
	Sig *Signature
	// Port is the port published; Notified the one onChange last ran for.
	Port, Notified int
	// LastBind is the last good bind; FailingSince the first failed
	// port-forwarding call after it (zero: none failed). A restart keeps
	// them, so a port that stopped being bound is judged lost on time,
	// however often the daemon restarts.
	LastBind, FailingSince time.Time
}

// savedFile is Saved as written: the token in the clear (the file is
// 0600 in a 0700 directory: PIA.md §6).
type savedFile struct {
	Version      int           `json:"version"`
	Token        string        `json:"token,omitempty"`
	TokenAt      time.Time     `json:"tokenAt,omitzero"`
	Registration *Registration `json:"registration,omitempty"`
	PortForward  *pfFile       `json:"portForward,omitempty"`
}

type pfFile struct {
	Payload   string    `json:"payload,omitempty"`
	Signature string    `json:"signature,omitempty"`
	SigPort   int       `json:"signaturePort,omitempty"`
	Expires   time.Time `json:"expires,omitzero"`
	Server    string    `json:"server,omitempty"`
	At        time.Time `json:"at,omitzero"`
	Port      int       `json:"port,omitempty"`
	Notified  int       `json:"notified,omitempty"`
	LastBind  time.Time `json:"lastBind,omitzero"`
	Failing   time.Time `json:"failingSince,omitzero"`
}

func (s Store) path(dev, ext string) string { return filepath.Join(s.Dir, dev+ext) }

func (s Store) mkdir() error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(s.Dir, 0o700)
}

// Load reads dev's saved state; a missing file is an empty Saved.
func (s Store) Load(dev string) (Saved, error) {
	b, err := fsafe.ReadFile(s.path(dev, ".json"), stateRules)
	if errors.Is(err, fs.ErrNotExist) {
		return Saved{}, nil
	}
	if err != nil {
		return Saved{}, err
	}
	var f savedFile
	if err := json.Unmarshal(b, &f); err != nil || f.Version != 1 {
		return Saved{}, fmt.Errorf("%s: not a state file of this version", s.path(dev, ".json"))
	}
	v := Saved{Token: Secret(f.Token), TokenAt: f.TokenAt, Reg: f.Registration}
	var errs []error
	if r := v.Reg; r != nil {
		// As checked as addKey's answer was: a cn that is not a host name
		// would carry the token into errors, an address that is not
		// unicast would become the device's.
		if err := r.check(); err != nil {
			errs = append(errs, fmt.Errorf("%s: the saved registration is not used: %w", s.path(dev, ".json"), err))
			v.Reg = nil
		}
	}
	if pf := f.PortForward; pf != nil {
		v.PF = &SavedPF{Port: pf.Port, Notified: pf.Notified, LastBind: pf.LastBind, FailingSince: pf.Failing}
		switch {
		case pf.Payload == "":
		case !ValidCN(pf.Server):
			errs = append(errs, fmt.Errorf("%s: the saved port-forwarding signature is not used: its server's cn is not a host name", s.path(dev, ".json")))
		default:
			v.PF.Sig = &Signature{Payload: Secret(pf.Payload), Signature: Secret(pf.Signature), Port: pf.SigPort,
				Expires: pf.Expires, Server: pf.Server, At: pf.At}
		}
	}
	return v, errors.Join(errs...)
}

// Save writes dev's state.
func (s Store) Save(dev string, v Saved) error {
	if err := s.mkdir(); err != nil {
		return err
	}
	f := savedFile{Version: 1, Token: v.Token.Value(), TokenAt: v.TokenAt, Registration: v.Reg}
	if pf := v.PF; pf != nil {
		f.PortForward = &pfFile{Port: pf.Port, Notified: pf.Notified, LastBind: pf.LastBind, Failing: pf.FailingSince}
		if s := pf.Sig; s != nil {
			f.PortForward.Payload, f.PortForward.Signature, f.PortForward.SigPort = s.Payload.Value(), s.Signature.Value(), s.Port
			f.PortForward.Expires, f.PortForward.Server, f.PortForward.At = s.Expires, s.Server, s.At
		}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if len(b) > MaxStateSize {
		// Written, it could not be read back: the next start would lose
		// the registration and the port. The file keeps what it held.
		return fmt.Errorf("%s: the state is %d bytes, over the %d a start reads back; not written", s.path(dev, ".json"), len(b), MaxStateSize)
	}
	return fsafe.WriteFile(s.path(dev, ".json"), b, 0o600)
}

// Forget removes dev's registration and token (teardown: the device is
// gone, so is what it ran with). Its key stays.
func (s Store) Forget(dev string) error {
	err := os.Remove(s.path(dev, ".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// ForgetAll removes every device's registration and token.
func (s Store) ForgetAll() error {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if n := e.Name(); e.Type().IsRegular() && filepath.Ext(n) == ".json" {
			errs = append(errs, s.Forget(n[:len(n)-len(".json")]))
		}
	}
	return errors.Join(errs...)
}

// Key returns dev's generated private key, generating and saving one the
// first time.
func (s Store) Key(dev string) (wg.Key, error) {
	p := s.path(dev, ".key")
	k, err := wg.ReadPrivateKeyFile(p)
	if err == nil {
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return wg.Key{}, err
	}
	if _, err := rand.Read(k[:]); err != nil {
		return wg.Key{}, err
	}
	k = k.Clamped() // as wg genkey does
	if err := s.mkdir(); err != nil {
		return wg.Key{}, err
	}
	line := base64.StdEncoding.EncodeToString(k[:]) + "\n"
	if err := fsafe.WriteFile(p, []byte(line), 0o600); err != nil {
		return wg.Key{}, err
	}
	return k, nil
}

// PeekKey reads dev's generated key without generating one.
func (s Store) PeekKey(dev string) (wg.Key, error) {
	return wg.ReadPrivateKeyFile(s.path(dev, ".key"))
}

// listPath is where the list of url is cached.
func (s Store) listPath(url string) string {
	h := sha256.Sum256([]byte(url))
	return filepath.Join(s.Dir, "list-"+hex.EncodeToString(h[:4])+".txt")
}

// listRules: the list is big, and not secret.
var listRules = fsafe.Rules{MaxSize: MaxListSize, RootOwned: true}

// LoadList reads the cached list of url and checks its signature again:
// a cache is no more trusted than the network. A missing cache is nil, nil.
func (s Store) LoadList(url string, key *rsa.PublicKey) (*List, time.Time, error) {
	p := s.listPath(url)
	b, err := fsafe.ReadFile(p, listRules)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, time.Time{}, nil
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	l, err := ParseList(b, key)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("cached %w", err)
	}
	var at time.Time
	if st, err := os.Stat(p); err == nil {
		at = st.ModTime()
	}
	return l, at, nil
}

// SaveList caches l as the list of url, as it was signed.
func (s Store) SaveList(url string, l *List) error {
	if err := s.mkdir(); err != nil {
		return err
	}
	var b bytes.Buffer
	b.Write(l.Raw)
	b.WriteString("\n\n")
	b.WriteString(base64.StdEncoding.EncodeToString(l.Signature))
	b.WriteString("\n")
	return fsafe.WriteFile(s.listPath(url), b.Bytes(), 0o600)
}
