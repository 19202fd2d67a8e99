package clients

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/register"
)

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestAllocate(t *testing.T) {
	dual := Device{Name: "wg0", Addrs: pfx("10.90.0.1/24", "fd00:90::1/64"), Pools: []Pool{{netip.MustParsePrefix("10.90.0.128/25"), "wg-pia"}}}
	v4 := Device{Name: "wg0", Addrs: pfx("10.90.0.1/29")}
	for _, tc := range []struct {
		name string
		dev  Device
		used []netip.Prefix
		via  string
		want []netip.Addr
		out  string
		err  string
	}{
		{name: "first free, v6 mirrors it", dev: dual, out: "10.90.0.2/32 fd00:90::2/128"},
		{name: "skips used and wider prefixes", dev: dual, used: pfx("10.90.0.2/32", "10.90.0.4/31", "fd00:90::3/128"), out: "10.90.0.3/32 fd00:90::2/128"},
		{name: "v6 taken at the mirror: lowest free", dev: dual, used: pfx("fd00:90::2/128"), out: "10.90.0.2/32 fd00:90::3/128"},
		{name: "never in a pool without via", dev: dual, used: pfx("10.90.0.0/25"), err: "no free address in 10.90.0.0/24"},
		{name: "via: from the pool, no v6", dev: dual, via: "wg-pia", out: "10.90.0.128/32"},
		{name: "via: pool's broadcast skipped", dev: dual, via: "wg-pia", used: pfx("10.90.0.128/26", "10.90.0.192/27", "10.90.0.224/28", "10.90.0.240/29", "10.90.0.248/30", "10.90.0.252/31", "10.90.0.254/32"), err: "no free address in 10.90.0.128/25"},
		{name: "via an unknown device", dev: dual, via: "wg-x", err: "no clients.egress pool via wg-x"},
		{name: "full /29", dev: v4, used: pfx("10.90.0.2/31", "10.90.0.4/31", "10.90.0.6/32"), err: "wg0: no free address in 10.90.0.0/29 (6 in use)"},
		{name: "last host", dev: v4, used: pfx("10.90.0.2/31", "10.90.0.4/31"), out: "10.90.0.6/32"},
		{name: "--ip", dev: dual, want: []netip.Addr{netip.MustParseAddr("10.90.0.9")}, out: "10.90.0.9/32"},
		{name: "--ip used", dev: dual, used: pfx("10.90.0.9/32"), want: []netip.Addr{netip.MustParseAddr("10.90.0.9")}, err: "--ip 10.90.0.9 is in use"},
		{name: "--ip own", dev: dual, want: []netip.Addr{netip.MustParseAddr("10.90.0.1")}, err: "is in use (wg0's own address)"},
		{name: "--ip outside", dev: dual, want: []netip.Addr{netip.MustParseAddr("10.91.0.9")}, err: "in none of wg0's subnets"},
		{name: "--ip broadcast", dev: dual, want: []netip.Addr{netip.MustParseAddr("10.90.0.255")}, err: "network or broadcast"},
		{name: "--ip in a pool", dev: dual, want: []netip.Addr{netip.MustParseAddr("10.90.0.200")}, err: "is in an egress pool"},
		{name: "--ip via outside its pool", dev: dual, via: "wg-pia", want: []netip.Addr{netip.MustParseAddr("10.90.0.20")}, err: "outside the pool"},
		{name: "no addresses", dev: Device{Name: "wg0"}, err: "has no addresses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Allocate(tc.dev, tc.used, tc.via, tc.want)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var s []string
			for _, p := range got {
				s = append(s, p.String())
			}
			if diff := cmp.Diff(tc.out, strings.Join(s, " ")); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestParseExpiry(t *testing.T) {
	now := time.Date(2026, 12, 8, 10, 0, 0, 500, time.UTC)
	for in, want := range map[string]string{
		"30d":                  "2027-01-07T10:00:00Z",
		"2w":                   "2026-12-22T10:00:00Z",
		"90m":                  "2026-12-08T11:30:00Z",
		"1h30m5s":              "2026-12-08T11:30:05Z",
		"2027-01-31T18:00:00Z": "2027-01-31T18:00:00Z",
		"2027-01-31":           "2027-01-31T00:00:00Z",
		"-5m":                  "error: not in the future",
		"2020-01-01":           "error: not in the future",
		"4000d":                "error: more than ten years",
		"soon":                 "error: neither",
		"":                     "error: empty",
	} {
		got, err := ParseExpiry(in, now)
		s := got.Format(time.RFC3339)
		if err != nil {
			s = "error: " + err.Error()
		}
		if !strings.HasPrefix(s, want) && !(strings.HasPrefix(want, "error: ") && strings.Contains(s, strings.TrimPrefix(want, "error: "))) {
			t.Errorf("ParseExpiry(%q) = %s, want %s", in, s, want)
		}
	}
}

func TestLifeOf(t *testing.T) {
	now := time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		p     config.WGPeer
		state string
	}{
		{config.WGPeer{}, StateActive},
		{config.WGPeer{Expires: "2026-12-08T10:00:01Z"}, StateActive},
		{config.WGPeer{Expires: "2026-12-08T10:00:00Z"}, StateExpired},
		{config.WGPeer{Disabled: true, Expires: "2020-01-01T00:00:00Z"}, StateDisabled},
	} {
		if l := LifeOf(tc.p, now); l.State != tc.state {
			t.Errorf("LifeOf(%+v) = %+v, want %s", tc.p, l, tc.state)
		}
	}
}

// TestCreateConcurrent: writers racing for one name: exactly one wins,
// the others get ErrExists, and no temporary file is left.
func TestCreateConcurrent(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Create(dir, "phone", fmt.Appendf(nil, "publicKey: %d\n", i))
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrExists):
			t.Errorf("unexpected error %v", err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if won != 1 || len(entries) != 1 || entries[0].Name() != "phone.yaml" {
		t.Errorf("%d writers won; dir holds %v", won, entries)
	}
	if st, _ := os.Stat(filepath.Join(dir, "phone.yaml")); st.Mode().Perm() != FileMode {
		t.Errorf("mode %v", st.Mode())
	}
}

// TestWrittenFileReads: what peer add writes is read by the register as
// the peer it describes, by the fast path where it can.
func TestWrittenFileReads(t *testing.T) {
	dir := t.TempDir()
	exp := time.Date(2027, 1, 7, 10, 0, 0, 0, time.UTC)
	for name, desc := range map[string]string{"phone": "alice's phone", "laptop": "Work laptop", "tab": ""} {
		f := File{Description: desc, PublicKey: "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=", AllowedIPs: pfx("10.90.0.2/32"), Expires: exp, Added: exp}
		if name != "phone" {
			f.PublicKey = map[string]string{"laptop": "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=", "tab": "TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0="}[name]
			f.AllowedIPs = pfx(map[string]string{"laptop": "10.90.0.3/32", "tab": "10.90.0.4/32"}[name])
		}
		if _, err := Create(dir, name, f.YAML()); err != nil {
			t.Fatal(err)
		}
	}
	reg := register.Load(dir, config.Options{})
	if len(reg.Errors) > 0 || len(reg.Peers) != 3 {
		t.Fatalf("register: %v, %d peers", reg.Errors, len(reg.Peers))
	}
	for _, p := range reg.Peers {
		if p.Peer.Expires != "2027-01-07T10:00:00Z" || (p.Peer.Name == "phone" && p.Peer.Description != "alice's phone") {
			t.Errorf("%s read as %+v", p.File, p.Peer)
		}
	}
	inv, err := Take(dir, []config.WGPeer{{Name: "static", AllowedIPs: []string{"10.90.0.9/32"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Names) != 4 || len(inv.Used) != 4 {
		t.Errorf("inventory %+v", inv)
	}
}

func TestSetDisabled(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "phone.yaml")
	orig := "# a comment kept\ndescription: phone\npublicKey: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\nallowedIPs: [10.90.0.2/32]\n"
	os.WriteFile(file, []byte(orig), 0o640)
	for _, step := range []struct {
		disabled, changed bool
		content           string
	}{
		{true, true, orig + "disabled: true\n"},
		{true, false, orig + "disabled: true\n"},
		{false, true, orig},
		{false, false, orig},
	} {
		changed, err := SetDisabled(file, step.disabled)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(file)
		if changed != step.changed || string(got) != step.content {
			t.Errorf("SetDisabled(%v): changed %v, file:\n%s", step.disabled, changed, got)
		}
	}
	if st, _ := os.Stat(file); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640 kept", st.Mode())
	}
	conf := filepath.Join(dir, "old.conf")
	os.WriteFile(conf, []byte("[Peer]\nPublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n"), 0o644)
	if _, err := SetDisabled(conf, true); err == nil || !strings.Contains(err.Error(), "wg-quick") {
		t.Errorf("a .conf file: %v", err)
	}
}

func TestConfigString(t *testing.T) {
	c := Config{Name: "phone", PrivateKey: "cHJpdmF0ZQ==", Addresses: []string{"10.90.0.2/32", "fd00:90::2/128"}, DNS: []string{"192.168.2.1"},
		ServerPublicKey: "c2VydmVy", Endpoint: "vpn.example.org:51820", AllowedIPs: []string{"10.90.0.0/24", "192.168.2.0/24"}, Keepalive: 25}
	want := `# phone
[Interface]
PrivateKey = cHJpdmF0ZQ==
Address = 10.90.0.2/32, fd00:90::2/128
DNS = 192.168.2.1

[Peer]
PublicKey = c2VydmVy
Endpoint = vpn.example.org:51820
AllowedIPs = 10.90.0.0/24, 192.168.2.0/24
PersistentKeepalive = 25
`
	if diff := cmp.Diff(want, c.String()); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"phone", "alice-laptop.2", "A_1"} {
		if err := CheckName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".hidden", "a/b", "phone.yaml", "x~", strings.Repeat("a", 64), "trail."} {
		if CheckName(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
