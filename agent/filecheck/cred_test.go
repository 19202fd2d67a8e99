package filecheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// TestHookCredentialsArg: the --credentials file of a shipped hook, in
// both of its argument spellings; none for another command.
func TestHookCredentialsArg(t *testing.T) {
	for _, c := range []struct {
		argv []string
		want string
	}{
		{[]string{"/usr/local/sbin/qbittorrent-port", "--url", "http://x", "--credentials", "/etc/nodeagent/qbittorrent.cred"}, "/etc/nodeagent/qbittorrent.cred"},
		{[]string{"/usr/local/sbin/transmission-port", "--credentials=/etc/nodeagent/t.cred", "--url", "http://x"}, "/etc/nodeagent/t.cred"},
		{[]string{"/usr/local/sbin/qbittorrent-port", "--url", "http://x", "--api-key", "/etc/nodeagent/qbittorrent.key"}, ""},
		{[]string{"/usr/local/sbin/qbittorrent-port", "--credentials"}, ""},
		{[]string{"/usr/local/sbin/my-hook", "--credentials", "/etc/x"}, ""},
		{nil, ""},
	} {
		if got := HookCredentials(c.argv); got != c.want {
			t.Errorf("%q: %q, want %q", c.argv, got, c.want)
		}
	}
}

// TestCredentialFilesOneFormat: validate reads the PIA account's file and
// a shipped hook's --credentials file with one reader (netcfg/cred), so
// every spelling is good in both places and a bad file is reported at the
// line of the field that names it, without its contents.
func TestCredentialFilesOneFormat(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), mode)
		os.Chmod(p, mode)
		return p
	}
	spellings := map[string]string{
		"keyvalue": "username=admin\npassword=hunter2\n",
		"bare":     "p1234567\nhunter2\n",
		"yaml":     "username: p1234567\npassword: hunter2\n",
	}
	check := func(piaCred, hookCred string) (errs config.ErrorList) {
		t.Helper()
		y := "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: " + piaCred +
			"\n      portForward:\n        enabled: true\n        onChange: [/usr/local/sbin/qbittorrent-port, --url, \"http://10.10.50.10:8080\", --credentials, " + hookCred + "]\n"
		c, err := config.ParseWith("nodeagent.yaml", []byte(y), config.Options{SkipFileChecks: true})
		if err != nil {
			t.Fatal(err)
		}
		errs, _ = Check(c, Options{StateDir: dir})
		return errs
	}
	credErrs := func(errs config.ErrorList) []string {
		var out []string
		for _, e := range errs {
			if s := e.Error(); !strings.Contains(s, "qbittorrent-port does not exist") {
				out = append(out, s)
			}
		}
		return out
	}
	for a, sa := range spellings {
		for b, sb := range spellings {
			pc, hc := write("pia-"+a+".cred", sa, 0o600), write("hook-"+b+".cred", sb, 0o600)
			if errs := credErrs(check(pc, hc)); len(errs) > 0 {
				t.Errorf("pia.cred %s, the hook's %s: %q", a, b, errs)
			}
		}
	}
	good := write("good.cred", spellings["keyvalue"], 0o600)
	for _, c := range []struct {
		name, pia, hook, want string
	}{
		{"hook's missing", good, filepath.Join(dir, "none.cred"), "nodeagent.yaml:8: wireguard[0].pia.portForward.onChange: --credentials " + dir + "/none.cred does not exist"},
		{"hook's group-readable", good, write("group.cred", spellings["keyvalue"], 0o640), "nodeagent.yaml:8: wireguard[0].pia.portForward.onChange: --credentials " + dir + "/group.cred is readable by group or others (mode 0640)"},
		{"hook's without password", good, write("nopass.cred", "username=admin\n", 0o600), "nodeagent.yaml:8: wireguard[0].pia.portForward.onChange: --credentials " + dir + "/nopass.cred: no password= line"},
		{"pia's three lines", write("three.cred", "p1234567\nhunter2\nextra\n", 0o600), good, "nodeagent.yaml:5: wireguard[0].pia.credentialsFile: " + dir + "/three.cred: has 3 lines"},
	} {
		errs := credErrs(check(c.pia, c.hook))
		if len(errs) != 1 || !strings.HasPrefix(errs[0], c.want) {
			t.Errorf("%s: %q, want one error %q", c.name, errs, c.want)
		}
		for _, e := range errs {
			if strings.Contains(e, "hunter2") || strings.Contains(e, "admin") {
				t.Errorf("%s: the error quotes the file: %s", c.name, e)
			}
		}
	}
}
