package host

import (
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAddrForm(t *testing.T) {
	p := netip.MustParsePrefix("10.10.50.1/24")
	plain := Addr{Prefix: p, Flags: unix.IFA_F_PERMANENT, ValidLft: Forever, PreferredLft: Forever}
	tests := []struct {
		name  string
		a     Addr
		form  []string
		plain bool
	}{
		{"ip addr add without options", plain, nil, true},
		{"kernel state flags are no form", Addr{Prefix: p, Flags: unix.IFA_F_PERMANENT | unix.IFA_F_SECONDARY | unix.IFA_F_TENTATIVE, ValidLft: Forever, PreferredLft: Forever}, nil, true},
		{"ours", Addr{Prefix: p, Flags: unix.IFA_F_PERMANENT, Proto: Proto, ValidLft: Forever, PreferredLft: Forever}, nil, false},
		{"NetworkManager's", Addr{Prefix: p, Flags: unix.IFA_F_PERMANENT | unix.IFA_F_NOPREFIXROUTE, ValidLft: Forever, PreferredLft: Forever}, []string{"noprefixroute"}, false},
		{"expiring", Addr{Prefix: p, ValidLft: 300, PreferredLft: 300}, []string{"valid_lft 300sec"}, false},
		{"deprecating", Addr{Prefix: p, ValidLft: Forever, PreferredLft: 60}, []string{"preferred_lft 60sec"}, false},
		{"metric", Addr{Prefix: p, ValidLft: Forever, PreferredLft: Forever, Metric: 400}, []string{"metric 400"}, false},
	}
	for _, tt := range tests {
		if got := tt.a.Form(); !slices.Equal(got, tt.form) {
			t.Errorf("%s: Form %q, want %q", tt.name, got, tt.form)
		}
		if got := tt.a.Plain(); got != tt.plain {
			t.Errorf("%s: Plain %v, want %v", tt.name, got, tt.plain)
		}
	}
}
