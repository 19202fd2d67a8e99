// Package wg converges WireGuard interfaces and their peers, with the
// Observe/Plan/Apply shape every nodeagent subsystem has (DESIGN.md §2).
//
// A device runs in the kernel (link type wireguard) or, where the kernel has
// no WireGuard, inside this process with wireguard-go over TUN, serving the
// standard UAPI socket so wg(8) and wgctrl see it either way. Both are
// configured through wgctrl.
//
// Ownership: a device is nodeagent's when its link carries IFLA_IFALIAS
// host.LinkAlias; its peers are all nodeagent's. A configured name that
// exists without the mark is a conflict unless the config says adopt.
//
// Peers are diffed one by one: a sync adds, removes and updates single peers
// (UpdateOnly, Remove, ReplaceAllowedIPs) and never replaces a device's whole
// peer list, so changing one peer leaves every other peer's session alone.
//
// Keys: private and preshared keys are Key values, which never print. Plans,
// errors, logs and status show public keys only.
package wg

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/plan"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Implementation names, as in the config's implementation field.
const (
	ImplAuto      = "auto"
	ImplKernel    = "kernel"
	ImplUserspace = "userspace"
)

// DefaultMTU is the MTU of a device whose config names none, as wg-quick
// picks for a 1500-byte underlay (1500 - 80 bytes of IPv6 + UDP + WireGuard).
const DefaultMTU = 1420

// Key is secret key material: a private or preshared key. It never prints
// in any format, so a Key in an error, log line or %+v dump shows nothing.
type Key [32]byte

const redacted = "(redacted)"

// String, GoString, Format and MarshalText print "(redacted)".
func (Key) String() string               { return redacted }
func (Key) GoString() string             { return redacted }
func (Key) Format(f fmt.State, _ rune)   { io.WriteString(f, redacted) }
func (Key) MarshalText() ([]byte, error) { return []byte(redacted), nil }

// IsZero reports whether the key is unset.
func (k Key) IsZero() bool { return k == Key{} }

// PublicKey returns the public key of a private key.
func (k Key) PublicKey() wgtypes.Key { return wgtypes.Key(k).PublicKey() }

// Clamped is private key k as the kernel and wireguard-go hold it: both
// clamp the key they are given (curve25519: the low three bits cleared,
// the top bit cleared and the next one set), as wg genkey does before it
// prints one. A key that was not (32 random bytes in base64) names the
// same public key but reads back different from what was written, so
// unclamped it would be drift on every observation.
func (k Key) Clamped() Key {
	if k.IsZero() {
		return k
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k
}

// ParseKey decodes a key as wg genkey writes it (base64, surrounding white
// space ignored). The error never repeats the text.
func ParseKey(s string) (Key, error) { return parseKey(strings.TrimSpace(s)) }

func parseKey(s string) (Key, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 32 {
		// Never echo the text: it may be a key with a typo in it.
		return Key{}, fmt.Errorf("not a WireGuard key (32 bytes of base64)")
	}
	return Key(b), nil
}

// Device is one desired WireGuard interface.
type Device struct {
	Name string
	// Impl is ImplAuto, ImplKernel or ImplUserspace. Auto picks the kernel
	// when it has WireGuard, and keeps the implementation an existing device
	// runs with.
	Impl       string
	PrivateKey Key
	ListenPort int
	FwMark     int
	MTU        int // 0: DefaultMTU
	Addrs      []netip.Prefix
	Adopt      bool
	Peers      []Peer
	// Broken says why the device cannot be converged (its key file cannot
	// be read, say). A broken device is reported and left as it is.
	Broken string
	// KeepPeers keeps kernel peers that the desired state lacks: the
	// register directory could not be read, so its absence proves nothing.
	KeepPeers bool
	// Skipped lists register entries that were reported and skipped
	// ("peers.d/bob.yaml:3: allowedIPs[0]: ..."); the device and its other
	// peers are converged.
	Skipped []string
	// KeyFiles are the key files the device was built from (its private
	// key, its peers' preshared keys), so the daemon can watch them.
	KeyFiles []string
	// Held are the peers of the config and the register kept out of the
	// device (disabled, or expired), for status; nothing is planned for
	// them but their absence.
	Held []HeldPeer
	// Stage is the staging device filled with Peers while they were read
	// (Stager), which the sync that creates the device takes if it holds
	// exactly what the creation writes; nil for none.
	Stage *Stage `json:"-"`
}

// Peer is one desired peer.
type Peer struct {
	PublicKey    wgtypes.Key
	Name         string
	PresharedKey Key
	// Endpoint is host:port as configured; "" for a peer that roams (the
	// usual remote-access client, whose endpoint the kernel learns).
	Endpoint   string
	AllowedIPs []netip.Prefix // sorted, masked
	Keepalive  time.Duration
	// Roams: Endpoint, even an address, is where the session starts; the
	// endpoint WireGuard learns from the peer's packets is kept while the
	// session is live (a VPN provider's server answering from another
	// of its addresses must not be fought every poll).
	Roams bool
	// Source is the register file the peer came from ("" for a peer of
	// the config itself).
	Source string
	// Expires is when the peer leaves the device (zero: never): from
	// then on it is held (netcfg's Desired.At).
	Expires time.Time
}

// HeldPeer is a peer kept out of its device: disabled in its file, or
// expired. Its file keeps it; status lists it with the reason.
type HeldPeer struct {
	PublicKey wgtypes.Key
	Name      string
	Source    string
	// State is "disabled" or "expired"; Reason says so for people.
	State, Reason string
	Expires       time.Time
	AllowedIPs    []netip.Prefix
}

// Desired is the whole desired state of this subsystem.
type Desired struct {
	Devices []Device
	// Partial says Devices are some of the desired devices, not all: owned
	// devices not among them are neither observed nor deleted (the drift
	// poll's look at the devices whose digest moved).
	Partial bool
}

// ObservedDevice is one device as the kernel (or this process) has it.
type ObservedDevice struct {
	Name  string
	Index int
	Kind  string // link type: wireguard, tun, or something foreign
	// Impl is ImplKernel or ImplUserspace for a WireGuard device, "" for a
	// link that is not one.
	Impl        string
	Owned       bool
	Interrupted bool // born with host.CreatingGroup, not yet marked
	MTU         int
	Up          bool
	Addrs       []ObservedAddr

	PrivateKey Key
	PublicKey  wgtypes.Key
	ListenPort int
	FwMark     int
	Peers      map[wgtypes.Key]ObservedPeer
	// Digest is of the state read (see Digest): the drift poll keeps it
	// for a device found converged.
	Digest Digest
}

// ObservedAddr is one address on an observed device.
type ObservedAddr struct {
	Prefix netip.Prefix
	Owned  bool
	// Markable: the kernel changes its IFA_PROTO mark in place
	// (host.Host.AddrMarkInPlace).
	Markable bool
}

// ObservedPeer is one peer as the device has it.
type ObservedPeer struct {
	PublicKey     wgtypes.Key
	PresharedKey  Key
	Endpoint      netip.AddrPort // zero: none
	Keepalive     time.Duration
	LastHandshake time.Time
	RxBytes       int64
	TxBytes       int64
	AllowedIPs    []netip.Prefix // sorted
}

// Resolved is the outcome of resolving one configured endpoint.
type Resolved struct {
	Addr netip.AddrPort
	Err  string
}

// Observed is the state that matters to this subsystem: every device the
// desired state names, every device nodeagent owns, and the resolution of
// every configured endpoint.
type Observed struct {
	Devices map[string]ObservedDevice
	// Resolved maps each desired endpoint (host:port) to what it resolved to.
	Resolved map[string]Resolved
	// Kernel reports whether the kernel has WireGuard.
	Kernel bool
	// Userspace reports whether this process can host userspace devices (a
	// long-running daemon can; a one-shot apply cannot, its devices would
	// die with it).
	Userspace bool
	// Time is when the state was read; handshake ages are relative to it.
	Time     time.Time
	MaxIndex int
	// Kept are, per device, the kernel peers an adoption kept although
	// the register does not name them (kept.go): never removed.
	Kept map[string]map[wgtypes.Key]bool
}

// OpKind says what an Op does.
type OpKind int

// The operations a plan is made of, in the order Apply runs them per device.
const (
	OpDeleteDevice OpKind = iota // removed from config, or recreated
	OpCreateDevice
	OpMarkDevice // adopt, or finish an interrupted creation
	OpSetMTU
	OpSetUp
	OpDelAddr
	OpAddAddr
	OpSetDevice // private key, listen port, fwmark
	OpRemovePeer
	OpAddPeer
	OpUpdatePeer
	OpKeepPeer   // an adoption keeps a kernel peer the register lacks, and records it
	OpForgetPeer // a kept peer joined the register or left the kernel: no longer kept apart
	OpFail       // not applied: reported (conflict, pending, skipped peer)
	// OpReleaseDevice hands an adopted device back (nodeagent release):
	// its mark and that of its addresses are taken off, and it stays as
	// it is, peers and all.
	OpReleaseDevice
)

// Op is one change to one object.
type Op struct {
	Kind   OpKind
	Device string
	Impl   string // for create
	Want   Device // for create and device changes
	Old    ObservedDevice
	Addr   netip.Prefix
	Peer   Peer        // for peer adds and updates
	PeerID wgtypes.Key // for peer ops
	// Endpoint is the resolved endpoint to set, zero for none.
	Endpoint netip.AddrPort
	// Fields are what an update changes (OpSetDevice, OpUpdatePeer).
	Fields Field
	// OldPeer is the peer as observed, for an update's plan text.
	OldPeer ObservedPeer
	Detail  string // the text after the object, for plan lines
	Failed  bool   // for OpFail: a failure, not a wait
	// Skipped marks an OpFail for one peer (or register entry) left out of
	// a device that is converged without it.
	Skipped bool
	// Pending marks an OpFail that waits for something (not a failure).
	Pending bool
	// NoHost marks an OpFail for a device only the userspace
	// implementation could run, in a process that cannot host it.
	NoHost bool
}

// Field is one setting an update changes; a Field value is a set of them.
type Field uint16

// The settings, in the order the plan text names them.
const (
	FieldPrivateKey Field = 1 << iota
	FieldListenPort
	FieldFwMark
	FieldEndpoint
	FieldKeepalive
	FieldPresharedKey
	FieldAllowedIPs
)

// Has reports whether f holds x.
func (f Field) Has(x Field) bool { return f&x != 0 }

// deviceFields are the settings a new device is written with.
const deviceFields = FieldPrivateKey | FieldListenPort | FieldFwMark

// Action is the first column of a plan line.
func (o Op) Action() byte {
	switch o.Kind {
	case OpCreateDevice, OpAddAddr, OpAddPeer:
		return '+'
	case OpDeleteDevice, OpDelAddr, OpRemovePeer:
		return '-'
	case OpFail:
		return '!'
	}
	return '~'
}

// Object names what the op is about, for errors and status.
func (o Op) Object() string {
	switch o.Kind {
	case OpAddAddr, OpDelAddr:
		return fmt.Sprintf("address %s on %s", o.Addr, o.Device)
	case OpAddPeer, OpRemovePeer, OpUpdatePeer, OpKeepPeer, OpForgetPeer:
		return peerObject(o.Device, o.PeerID, o.Peer.Name)
	}
	if o.Kind == OpFail && o.PeerID != (wgtypes.Key{}) {
		return peerObject(o.Device, o.PeerID, o.Peer.Name)
	}
	return "wireguard " + o.Device
}

func peerObject(dev string, k wgtypes.Key, name string) string {
	s := "wireguard " + dev + " peer " + k.String()
	if name != "" {
		s += " (" + name + ")"
	}
	return s
}

func (o Op) String() string { return o.text(o.Object()) }

// text is the op's plan line, given its Object (a report entry has both,
// and a plan of thousands of peers should not name each twice).
func (o Op) text(s string) string {
	switch o.Kind {
	case OpDeleteDevice:
		s += fmt.Sprintf(" (%s)", o.Old.Impl)
	case OpCreateDevice:
		s += fmt.Sprintf(" (%s, public key %s, listen port %d, mtu %d)", o.Impl, o.Want.PrivateKey.PublicKey(), o.Want.ListenPort, mtuOf(o.Want))
	case OpMarkDevice:
		if o.Old.Interrupted {
			s += " mark (its creation was interrupted)"
		} else {
			s += " adopt (mark as nodeagent's)"
		}
	case OpSetMTU:
		s += fmt.Sprintf(" mtu %d -> %d", o.Old.MTU, mtuOf(o.Want))
	case OpSetUp:
		s += " down -> up"
	case OpSetDevice, OpUpdatePeer:
		s += " " + strings.Join(o.changes(), ", ")
	case OpAddPeer:
		s += " " + describePeer(o.Peer, o.Endpoint)
	case OpKeepPeer:
		s += " kept (in the kernel, not in the register: the adoption leaves it as it is, and nodeagent never removes it; add its file to the register to manage it, or remove it with wg set)"
	case OpForgetPeer:
		s += " no longer kept apart"
	case OpReleaseDevice:
		s += fmt.Sprintf(" (%s) hand back: unmark it", o.Old.Impl)
		unmark, kept := releasedAddrs(o.Old)
		if len(unmark) > 0 {
			s += " and its addresses " + prefixList(unmark)
		}
		s += "; it stays as it is, peers and all"
		if len(kept) > 0 {
			s += fmt.Sprintf("; %s keeps the mark (the kernel changes an IPv4 address's mark in place only from Linux 6.4, and release deletes nothing)", prefixList(kept))
		}
	}
	if o.Detail != "" {
		s += ": " + o.Detail
	}
	return string(o.Action()) + " " + s
}

// changes says what an update changes, with the old and new values (no
// key but a public one).
func (o Op) changes() []string {
	var out []string
	f := o.Fields
	if f.Has(FieldPrivateKey) {
		out = append(out, fmt.Sprintf("private key (public key %s -> %s)", o.Old.PublicKey, o.Want.PrivateKey.PublicKey()))
	}
	if f.Has(FieldListenPort) {
		out = append(out, fmt.Sprintf("listen port %d -> %d", o.Old.ListenPort, o.Want.ListenPort))
	}
	if f.Has(FieldFwMark) {
		out = append(out, fmt.Sprintf("fwmark %#x -> %#x", o.Old.FwMark, o.Want.FwMark))
	}
	if f.Has(FieldEndpoint) {
		out = append(out, fmt.Sprintf("endpoint %s -> %s", endpointText(o.OldPeer.Endpoint), o.Endpoint))
	}
	if f.Has(FieldKeepalive) {
		out = append(out, fmt.Sprintf("keepalive %s -> %s", o.OldPeer.Keepalive, o.Peer.Keepalive))
	}
	if f.Has(FieldPresharedKey) {
		out = append(out, "preshared key")
	}
	if f.Has(FieldAllowedIPs) {
		out = append(out, fmt.Sprintf("allowed IPs %s -> %s", joinPrefixes(o.OldPeer.AllowedIPs), joinPrefixes(o.Peer.AllowedIPs)))
	}
	return out
}

func describePeer(p Peer, ep netip.AddrPort) string {
	b := append(make([]byte, 0, 64), "allowed IPs "...)
	b = appendPrefixes(b, p.AllowedIPs)
	if p.Endpoint != "" {
		b = append(b, ", endpoint "...)
		b = append(b, p.Endpoint...)
		if ep.IsValid() && ep.String() != p.Endpoint {
			b = append(b, " = "...)
			b = ep.AppendTo(b)
		}
	}
	if p.Keepalive > 0 {
		b = append(b, ", keepalive "...)
		b = append(b, p.Keepalive.String()...)
	}
	if !p.PresharedKey.IsZero() {
		b = append(b, ", preshared key"...)
	}
	return string(b)
}

func joinPrefixes(ps []netip.Prefix) string { return string(appendPrefixes(nil, ps)) }

func appendPrefixes(b []byte, ps []netip.Prefix) []byte {
	if len(ps) == 0 {
		return append(b, "(none)"...)
	}
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		b = p.AppendTo(b)
	}
	return b
}

func mtuOf(d Device) int {
	if d.MTU == 0 {
		return DefaultMTU
	}
	return d.MTU
}

// Plan is an ordered list of ops. The zero Plan changes nothing.
type Plan struct {
	plan.Ops[Op]
	Desired  Desired
	Observed Observed
}

// Writes reports whether the plan changes anything (as opposed to only
// reporting).
func (p Plan) Writes() bool {
	return slices.ContainsFunc(p.Ops, func(o Op) bool { return o.Kind != OpFail })
}

// NeedHost returns the devices that only the userspace implementation could
// run and this process cannot host.
func (p Plan) NeedHost() []string {
	var out []string
	for _, o := range p.Ops {
		if o.NoHost {
			out = append(out, o.Device)
		}
	}
	return out
}

func sortPrefixes(ps []netip.Prefix) {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
}

// Release is the op that hands the adopted device od back
// (OpReleaseDevice); why, when not empty, says who takes it back.
func Release(od ObservedDevice, why string) Op {
	return Op{Kind: OpReleaseDevice, Device: od.Name, Old: od, Detail: why}
}

// releasedAddrs are the addresses a release unmarks (those with the
// mark), and those it cannot: IPv4 before Linux 6.4, where the kernel
// takes no new IFA_PROTO in place and release deletes nothing.
func releasedAddrs(od ObservedDevice) (unmark, kept []netip.Prefix) {
	for _, a := range od.Addrs {
		switch {
		case !a.Owned:
		case a.Markable:
			unmark = append(unmark, a.Prefix)
		default:
			kept = append(kept, a.Prefix)
		}
	}
	return unmark, kept
}

func prefixList(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}
