package pia

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"
)

// List is PIA's server list, as signed.
type List struct {
	// Raw is the signed JSON line; Signature its signature. Together they
	// are what is cached, and checked again when read back.
	Raw       []byte
	Signature []byte
	Groups    map[string][]Group `json:"groups"`
	Regions   []Region           `json:"regions"`
	// Dropped counts what the list named that is not used: servers whose
	// cn is not a host name or whose IP is not a unicast IPv4 address,
	// regions whose id is not a plain name (see sanitize).
	Dropped int `json:"-"`
}

// Group is a group of ports ("wg": the WireGuard API port; "meta": the
// meta servers').
type Group struct {
	Name  string `json:"name"`
	Ports []int  `json:"ports"`
}

// Region is one of PIA's regions.
type Region struct {
	ID          string              `json:"id"`
	Name        string              `json:"name"`
	Country     string              `json:"country"`
	DNS         string              `json:"dns"`
	PortForward bool                `json:"port_forward"`
	Geo         bool                `json:"geo"`
	Offline     bool                `json:"offline"`
	Servers     map[string][]Server `json:"servers"`
}

// Server is one server of a region: its IP and the cn its certificate
// names.
type Server struct {
	IP string `json:"ip"`
	CN string `json:"cn"`
}

// Addr is the server's IP as an address.
func (s Server) Addr() (netip.Addr, error) { return netip.ParseAddr(s.IP) }

// MaxListSize bounds the server list (PIA's is a few hundred KiB).
const MaxListSize = 8 << 20

// ParseList checks body, as the list host serves it (one line of compact
// JSON, a blank line, base64 of an RSA PKCS#1 v1.5 SHA-256 signature over
// exactly the JSON line), against key and parses it.
func ParseList(body []byte, key *rsa.PublicKey) (*List, error) {
	line, rest, ok := bytes.Cut(body, []byte("\n"))
	if !ok {
		return nil, errors.New("server list: no signature after the JSON line")
	}
	sig, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(rest)))
	if err != nil {
		return nil, errors.New("server list: the signature is not base64")
	}
	return checkList(line, sig, key)
}

func checkList(line, sig []byte, key *rsa.PublicKey) (*List, error) {
	sum := sha256.Sum256(line)
	if err := rsa.VerifyPKCS1v15(key, crypto.SHA256, sum[:], sig); err != nil {
		return nil, errors.New("server list: the signature does not verify (tampered with, or signed by another key)")
	}
	l := &List{Raw: bytes.Clone(line), Signature: bytes.Clone(sig)}
	if err := json.Unmarshal(line, l); err != nil {
		return nil, fmt.Errorf("server list: %w", err)
	}
	l.sanitize()
	return l, nil
}

// maxRegionID bounds a region's id (PIA's are like nl_amsterdam).
const maxRegionID = 64

// validRegionID reports whether id is a plain name: letters, digits, '_',
// '-' and '.', at most maxRegionID characters.
func validRegionID(id string) bool {
	if id == "" || len(id) > maxRegionID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// sanitize drops, as the list is loaded (fetched or read from the cache),
// what no request may be made from: a server whose cn is not a DNS host
// name (it goes into the URL and the TLS name, and a space or '%' there
// put the token into errors) or whose IP is not a unicast IPv4 address
// (it is dialled as it is: a name would be resolved), and a region whose
// id is not a plain name (it is saved with the registration). The
// signature covers the list as PIA sent it; this only uses less of it.
func (l *List) sanitize() {
	regions := l.Regions[:0]
	for _, r := range l.Regions {
		if !validRegionID(r.ID) {
			l.Dropped++
			continue
		}
		for kind, ss := range r.Servers {
			keep := make([]Server, 0, len(ss))
			for _, s := range ss {
				if a, err := netip.ParseAddr(s.IP); err != nil || unicast4(a) != "" || !ValidCN(s.CN) {
					l.Dropped++
					continue
				}
				keep = append(keep, s)
			}
			r.Servers[kind] = keep
		}
		regions = append(regions, r)
	}
	l.Regions = regions
}

// Region returns the region with id.
func (l *List) Region(id string) (Region, bool) {
	i := slices.IndexFunc(l.Regions, func(r Region) bool { return r.ID == id })
	if i < 0 {
		return Region{}, false
	}
	return l.Regions[i], true
}

// port returns the first port of group, or def.
func (l *List) port(group string, def int) int {
	for _, g := range l.Groups[group] {
		if len(g.Ports) > 0 {
			return g.Ports[0]
		}
	}
	return def
}

// WGPort is the port of the WireGuard servers' API (addKey).
func (l *List) WGPort() int { return l.port("wg", 1337) }

// MetaPort is the port the meta servers answer on.
func (l *List) MetaPort() int { return l.port("meta", 443) }

// fetchList gets the list from url with c, and checks it.
func fetchList(ctx context.Context, c httpDoer, url string, key *rsa.PublicKey) (*List, error) {
	req, err := newRequest(ctx, "server list", http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("server list: %w", stripURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("server list: HTTP %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxListSize+1))
	if err != nil {
		return nil, fmt.Errorf("server list: %w", err)
	}
	if len(body) > MaxListSize {
		return nil, fmt.Errorf("server list: over %d bytes", MaxListSize)
	}
	return ParseList(body, key)
}

// candidates are the regions a choice of "auto" may take: online, and with
// port forwarding when it is wanted.
func (l *List) candidates(portForward bool) []Region {
	var out []Region
	for _, r := range l.Regions {
		if r.Offline || (portForward && !r.PortForward) || len(r.Servers["wg"]) == 0 || len(r.Servers["meta"]) == 0 {
			continue
		}
		out = append(out, r)
	}
	return out
}

// latencyTimeout bounds one latency probe (PIA's scripts use 50 ms; a
// namespace lab or a slow link needs more).
const latencyTimeout = 500 * time.Millisecond

// fastest returns the region whose first meta server accepts a TCP
// connection soonest, measured in parallel, as PIA's scripts choose.
func fastest(ctx context.Context, dial DialFunc, regions []Region, metaPort int) (Region, time.Duration, error) {
	type res struct {
		r   Region
		d   time.Duration
		err error
	}
	out := make([]res, len(regions))
	var wg sync.WaitGroup
	for i, r := range regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctx, latencyTimeout)
			defer cancel()
			start := time.Now()
			c, err := dial(ctx, "tcp", net.JoinHostPort(r.Servers["meta"][0].IP, fmt.Sprint(metaPort)))
			if err == nil {
				c.Close()
			}
			out[i] = res{r, time.Since(start), err}
		}()
	}
	wg.Wait()
	sort.SliceStable(out, func(i, j int) bool {
		if (out[i].err == nil) != (out[j].err == nil) {
			return out[i].err == nil
		}
		return out[i].d < out[j].d
	})
	if len(out) == 0 || out[0].err != nil {
		return Region{}, 0, errors.New("no region's meta server answered")
	}
	return out[0].r, out[0].d, nil
}
