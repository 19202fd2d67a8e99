package cred

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// hookOnlyRefuses are the cases the shipped hooks refuse although Parse
// reads them: YAML beyond username: and password: lines, which a shell
// does not parse (the hook says to write KEY=VALUE lines).
var hookOnlyRefuses = map[string]string{
	"YAML flow": "a YAML flow map, which this hook does not read",
}

// TestShippedHooksReadTheOneFormat: the port hooks the package ships
// read their --credentials file as Parse does: for every case of
// parseCases, qbittorrent-port logs in, and transmission-port
// authenticates, with exactly the user and password Parse reads, and
// where Parse refuses the file, the hook exits 1 without a request and
// without quoting it. The client's side is a stand-in answering the
// requests each hook makes (qBittorrent's login and preferences,
// Transmission's session-get with its session-id exchange); the hooks
// against the real programs are agent's TestQBittorrentPort and
// TestTransmissionPort.
func TestShippedHooksReadTheOneFormat(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the hooks take only a credentials file root owns")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("the hooks need curl (make test installs it)")
	}
	const port = 47000
	var mu sync.Mutex
	var got []string // "user\x00password" of each login
	saw := func(u, p string) {
		mu.Lock()
		got = append(got, u+"\x00"+p)
		mu.Unlock()
	}
	qbt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v2/auth/login":
			r.ParseForm()
			saw(r.PostForm.Get("username"), r.PostForm.Get("password"))
			http.SetCookie(w, &http.Cookie{Name: "SID", Value: "s1d"})
			fmt.Fprint(w, "Ok.")
		case "/api/v2/app/preferences":
			fmt.Fprintf(w, `{"listen_port":%d}`, port)
		case "/api/v2/auth/logout":
		default:
			http.NotFound(w, r)
		}
	}))
	defer qbt.Close()
	trm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Transmission-Session-Id") != "sess1" {
			w.Header().Set("X-Transmission-Session-Id", "sess1")
			w.WriteHeader(http.StatusConflict)
			return
		}
		u, p, _ := r.BasicAuth()
		saw(u, p)
		fmt.Fprintf(w, `{"arguments":{"peer-port":%d},"result":"success"}`, port)
	}))
	defer trm.Close()

	dir := t.TempDir()
	run := func(path, url, file string) (out []byte, stderr bytes.Buffer, err error) {
		cmd := exec.Command(path, "--url", url, "--credentials", file, "--timeout", "5")
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8", fmt.Sprintf("NODEAGENT_PIA_PORT=%d", port), "NODEAGENT_PIA_PORT_LOST=0"}
		cmd.Stderr = &stderr
		out, err = cmd.Output()
		return out, stderr, err
	}
	for _, hook := range []struct{ name, url string }{{"qbittorrent-port", qbt.URL}, {"transmission-port", trm.URL}} {
		path, err := filepath.Abs(filepath.Join("..", "..", "packaging", "examples", "hooks", hook.name))
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range parseCases {
			file := filepath.Join(dir, fmt.Sprintf("%s-%d.cred", hook.name, i))
			if err := os.WriteFile(file, []byte(c.in), 0o600); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			got = nil
			mu.Unlock()
			out, stderr, err := run(path, hook.url, file)
			mu.Lock()
			logins := got
			mu.Unlock()
			what := fmt.Sprintf("%s, %s (%q)", hook.name, c.name, c.in)
			refusal, hookRefuses := hookOnlyRefuses[c.name]
			switch {
			case c.err == "" && !hookRefuses:
				want := c.user + "\x00" + c.wantPass()
				if err != nil || len(logins) != 1 || logins[0] != want {
					t.Errorf("%s: %v, logins %q, want one as %q; %s%s", what, err, logins, want, out, stderr.String())
				}
			case hookRefuses && !strings.Contains(stderr.String(), refusal):
				t.Errorf("%s: %v, stderr %q, want %q", what, err, stderr.String(), refusal)
			case exitCode(err) != 1 || len(logins) != 0:
				t.Errorf("%s: accepted (%v, logins %q), but Parse refuses it (%s); %s%s", what, err, logins, c.err, out, stderr.String())
			}
			for _, s := range []string{"hunter2", "s3cret", "p1234567"} {
				if strings.Contains(stderr.String()+string(out), s) {
					t.Errorf("%s: the hook's output quotes the file: %s%s", what, out, stderr.String())
				}
			}
		}

		// The file itself, as Read takes it: not a link, not readable
		// by others, not too big.
		good := filepath.Join(dir, hook.name+"-good.cred")
		os.WriteFile(good, []byte("username=admin\npassword="+secret+"\n"), 0o600)
		link := filepath.Join(dir, hook.name+"-link.cred")
		os.Symlink(good, link)
		group := filepath.Join(dir, hook.name+"-group.cred")
		os.WriteFile(group, []byte("username=admin\npassword="+secret+"\n"), 0o600)
		os.Chmod(group, 0o640)
		big := filepath.Join(dir, hook.name+"-big.cred")
		os.WriteFile(big, []byte("username=admin\npassword="+strings.Repeat("x", MaxSize)+"\n"), 0o600)
		for _, c := range []struct{ file, want string }{
			{link, "not a regular file"},
			{group, "mode 640, want 0600 or stricter"},
			{big, "too big"},
		} {
			mu.Lock()
			got = nil
			mu.Unlock()
			_, stderr, err := run(path, hook.url, c.file)
			mu.Lock()
			logins := got
			mu.Unlock()
			if exitCode(err) != 1 || len(logins) != 0 || !strings.Contains(stderr.String(), c.file+": "+c.want) {
				t.Errorf("%s %s: %v, logins %d, stderr %q; want exit 1 and %q", hook.name, c.file, err, len(logins), stderr.String(), c.want)
			}
		}
	}
}

// exitCode is a command's exit status from its error (0: none).
func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
