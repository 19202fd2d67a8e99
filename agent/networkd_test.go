package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNetworkdConflicts(t *testing.T) {
	tests := []struct {
		name    string
		running bool
		conf    string
		dropin  string
		want    []string
	}{
		{"networkd not running", false, "", "", nil},
		{"defaults delete foreign rules and routes", true, "", "", []string{"ManageForeignRoutingPolicyRules=yes", "ManageForeignRoutes=yes"}},
		{"both off in networkd.conf", true, "[Network]\nManageForeignRoutingPolicyRules=no\nManageForeignRoutes=no\n", "", nil},
		{"a drop-in overrides", true, "[Network]\nManageForeignRoutingPolicyRules=no\nManageForeignRoutes=no\n", "[Network]\nManageForeignRoutes=yes\n", []string{"ManageForeignRoutes=yes"}},
		{"other sections do not count", true, "[DHCPv4]\nManageForeignRoutes=no\n[Network]\nManageForeignRoutingPolicyRules=false\n", "", []string{"ManageForeignRoutes=yes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := NetworkdPaths{Proc: filepath.Join(dir, "proc"), Conf: filepath.Join(dir, "networkd.conf"), ConfDirs: []string{filepath.Join(dir, "d")}}
			os.MkdirAll(filepath.Join(p.Proc, "1"), 0o755)
			os.WriteFile(filepath.Join(p.Proc, "1", "comm"), []byte("systemd\n"), 0o644)
			if tt.running {
				os.MkdirAll(filepath.Join(p.Proc, "42"), 0o755)
				os.WriteFile(filepath.Join(p.Proc, "42", "comm"), []byte("systemd-network\n"), 0o644)
			}
			os.WriteFile(p.Conf, []byte(tt.conf), 0o644)
			os.Mkdir(p.ConfDirs[0], 0o755)
			os.WriteFile(filepath.Join(p.ConfDirs[0], "50-x.conf"), []byte(tt.dropin), 0o644)
			got := NetworkdConflicts(p)
			if len(got) != len(tt.want) {
				t.Fatalf("got %q, want %d warnings naming %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q does not name %q", got[i], w)
				}
			}
		})
	}
}
