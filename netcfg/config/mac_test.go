package config

import (
	"strings"
	"testing"
)

func TestMacvlanMAC(t *testing.T) {
	base := "macvlans:\n  - {name: shim0, parent: enp1s0, mac: %s}\n  - {name: shim1, parent: enp1s0, mac: %s}\n"
	for _, tc := range []struct{ a, b, want string }{
		{"02:11:22:33:44:55", "02:11:22:33:44:56", ""},
		{"02:11:22:33:44", "02:11:22:33:44:56", ":2: macvlans[0].mac: \"02:11:22:33:44\" is not a MAC address"},
		{"01:00:5e:00:00:01", "02:11:22:33:44:56", ":2: macvlans[0].mac: \"01:00:5e:00:00:01\" is a multicast address"},
		{"00:00:00:00:00:00", "02:11:22:33:44:56", ":2: macvlans[0].mac: \"00:00:00:00:00:00\" is all zeros"},
		{"02:11:22:33:44:55", "02:11:22:33:44:55", ":3: macvlans[1].mac: 02:11:22:33:44:55 is also shim0's"},
	} {
		cfg := strings.Replace(strings.Replace(base, "%s", tc.a, 1), "%s", tc.b, 1)
		_, err := Parse("n.yaml", []byte(cfg))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s / %s: %v", tc.a, tc.b, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), "n.yaml"+tc.want)):
			t.Errorf("%s / %s: %v, want %q", tc.a, tc.b, err, tc.want)
		}
	}
}
