package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that no input makes Parse panic, that every failure is
// an ErrorList of located errors, that results are deterministic, and that
// whatever Parse accepts also passes Validate on its own.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "homelab.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	for _, s := range []string{
		"",
		"vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, mtu: 1500, addresses: [10.10.50.1/24]}\n",
		"vlans:\n  - &v {name: a, parent: b, id: 1}\n  - <<: *v\n    name: c\n    id: 2\n",
		"a: &a [*a]\n",
		"x: &x {<<: *x}\n",
		"macvlans:\n  - {name: vlan50-shim, parent: enp1s0.50, mode: bridge, addresses: [10.10.50.3/32]}\n",
		"routing:\n  tables: [{id: 150, routes: [{to: default, dev: wg-pia}]}]\n  rules: [{priority: 1000, from: 10.10.50.0/24, table: 150}]\n",
		"kubernetes:\n  labels: {homelab.example/vpn-ingress: \"true\"}\n",
		"sysctls: {net.ipv4.ip_forward: 1}\n",
		"dad: {probes: 3, interval: 1s, wait: 2s, announcements: 0}\n",
		"node: {}\n---\nnode: {}\n",
		"- 1\n",
	} {
		f.Add([]byte(s))
	}
	opts := Options{SkipFileChecks: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseWith(testFile, data, opts)
		if c == nil || c.File != testFile {
			t.Fatalf("ParseWith returned config %+v", c)
		}
		if err != nil {
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error is not a non-empty ErrorList: %T %v", err, err)
			}
			for _, e := range list {
				if e.File != testFile || e.Msg == "" || e.Line < 0 {
					t.Fatalf("malformed FieldError %#v", e)
				}
			}
			_, err2 := ParseWith(testFile, data, opts)
			if err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("second parse differs:\n%v\nthen\n%v", err, err2)
			}
			return
		}
		if err := c.Validate(opts); err != nil {
			t.Fatalf("Parse accepted the config but Validate rejects it: %v", err)
		}
	})
}
