package wg

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Get writes device name's state to w in the UAPI "get" format, as its
// socket answers wg(8), straight from wireguard-go in this process; ok is
// false when this process runs no such device. Reading it so makes no UAPI
// connection, so it leaves Generation where it was.
func (u *Userspace) Get(name string, w *bytes.Buffer) (ok bool, err error) {
	u.mu.Lock()
	d, found := u.devs[name]
	u.mu.Unlock()
	if !found || !d.alive() {
		return false, nil
	}
	return true, d.dev.IpcGetOperation(w)
}

// readUserspace fills in od, a device this process runs, from its UAPI
// text read in process (Userspace.Get) into the observation's types: the
// same observation as wgctrl's read through the socket (observePeer),
// without the socket's round trip and with a quarter of the garbage: every
// resync reads each device whole, and with 5000 peers wgctrl's read left
// 9.5 MB (120 000 allocations) to collect each time, about one collection
// of wireguard-go's large heap per resync; this read leaves 2.2 MB (30 000
// allocations), the new map of peers and wireguard-go's own formatting
// among them (BenchmarkWGPoll5000/full/userspace).
// ok is false when this process runs no such device; hint is how many
// peers to make room for.
func (h *Handle) readUserspace(od *ObservedDevice, hint int) (ok bool, err error) {
	buf := bytes.NewBuffer(h.usBuf[:0])
	ok, err = h.Userspace.Get(od.Name, buf)
	h.usBuf = buf.Bytes()[:0]
	if !ok || err != nil {
		return ok, err
	}
	if err := parseUAPI(od, buf.Bytes(), hint); err != nil {
		return false, err
	}
	h.sawPeers(od.Name, len(od.Peers))
	return true, nil
}

// parseUAPI fills in od's key, port, fwmark and peers from text, a UAPI
// "get" answer; hint is how many peers to make room for.
func parseUAPI(od *ObservedDevice, text []byte, hint int) error {
	peers := make(map[wgtypes.Key]ObservedPeer, hint)
	var p ObservedPeer
	var hsSec, hsNsec int64
	inPeer := false
	flush := func() {
		if !inPeer {
			return
		}
		if hsSec != 0 || hsNsec != 0 {
			p.LastHandshake = time.Unix(hsSec, hsNsec)
		}
		sortPrefixes(p.AllowedIPs)
		peers[p.PublicKey] = p
	}
	for line := 1; len(text) > 0; line++ {
		var l []byte
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			l, text = text[:i], text[i+1:]
		} else {
			l, text = text, nil
		}
		if len(l) == 0 {
			continue
		}
		key, value, found := bytes.Cut(l, []byte{'='})
		if !found {
			return fmt.Errorf("uapi get, line %d: no '='", line)
		}
		var bad bool
		switch string(key) {
		case "public_key":
			flush()
			p, hsSec, hsNsec, inPeer = ObservedPeer{}, 0, 0, true
			bad = !hexKey(p.PublicKey[:], value)
		case "private_key":
			bad = inPeer || !hexKey(od.PrivateKey[:], value)
		case "listen_port":
			var n int64
			n, bad = uapiInt(value)
			od.ListenPort = int(n)
		case "fwmark":
			var n int64
			n, bad = uapiInt(value)
			od.FwMark = int(n)
		case "preshared_key":
			bad = !inPeer || !hexKey(p.PresharedKey[:], value)
		case "endpoint":
			ap, err := netip.ParseAddrPort(string(value))
			bad = !inPeer || err != nil
			p.Endpoint = netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
		case "last_handshake_time_sec":
			hsSec, bad = uapiInt(value)
		case "last_handshake_time_nsec":
			hsNsec, bad = uapiInt(value)
		case "tx_bytes":
			p.TxBytes, bad = uapiInt(value)
		case "rx_bytes":
			p.RxBytes, bad = uapiInt(value)
		case "persistent_keepalive_interval":
			var n int64
			n, bad = uapiInt(value)
			p.Keepalive = time.Duration(n) * time.Second
		case "allowed_ip":
			pfx, err := netip.ParsePrefix(string(value))
			bad = !inPeer || err != nil
			// As observePeer has it from wgctrl's net.IPNet.
			p.AllowedIPs = append(p.AllowedIPs, netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()).Masked())
		case "errno":
			if n, _ := uapiInt(value); n != 0 {
				return fmt.Errorf("uapi get: errno=%d", n)
			}
		}
		if bad {
			return fmt.Errorf("uapi get, line %d: bad %s", line, key)
		}
	}
	flush()
	// As wgctrl derives it, a zero private key's too.
	od.PublicKey = wgtypes.Key(od.PrivateKey).PublicKey()
	od.Peers = peers
	return nil
}

// hexKey decodes a 64-digit hex key into k.
func hexKey(k []byte, s []byte) bool {
	if len(s) != 2*len(k) {
		return false
	}
	_, err := hex.Decode(k, s)
	return err == nil
}

// uapiInt parses a decimal the UAPI writes (never negative); bad is true
// when it is not one.
func uapiInt(s []byte) (n int64, bad bool) {
	if len(s) == 0 || len(s) > 19 {
		return 0, true
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, true
		}
		n = n*10 + int64(c-'0')
	}
	return n, false
}
