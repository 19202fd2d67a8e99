package cred

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// secret is the password of every case: no error may hold it, nor the
// user name.
const secret = "hunter2 s3cret"

// parseCase is a credentials file's content and what Parse makes of it.
type parseCase struct {
	name, in string
	user     string // want this user
	pass     string // and this password ("": secret)
	err      string // or an error holding this
}

// wantPass is the password c wants.
func (c parseCase) wantPass() string {
	if c.pass == "" {
		return secret
	}
	return c.pass
}

// parseCases: each spelling of the one format, and hostile contents.
var parseCases = []parseCase{
	// The three spellings.
	{"key=value", "username=p1234567\npassword=" + secret + "\n", "p1234567", "", ""},
	{"key=value, password first", "password=" + secret + "\nusername=p1234567\n", "p1234567", "", ""},
	{"key=value, comments and blank lines", "# qBittorrent's WebUI\n\nusername=admin\n\n# set in the WebUI\npassword=" + secret + "\n", "admin", "", ""},
	{"key=value without the last newline", "username=admin\npassword=" + secret, "admin", "", ""},
	{"key=value, '=' in the password", "username=admin\npassword=a=b \n", "admin", "a=b ", ""},
	{"two bare lines", "p1234567\n" + secret + "\n", "p1234567", "", ""},
	{"two bare lines, spaces trimmed", "  p1234567 \n" + secret + "  \n\n", "p1234567", "", ""},
	{"two bare lines without the last newline", "p1234567\n" + secret, "p1234567", "", ""},
	{"YAML", "username: p1234567\npassword: " + secret + "\n", "p1234567", "", ""},
	{"YAML quoted", "# PIA\nusername: \"p1234567\"\npassword: '" + secret + "'\n", "p1234567", "", ""},
	{"YAML flow", "{username: p1234567, password: \"" + secret + "\"}\n", "p1234567", "", ""},
	{"YAML document marker", "---\nusername: p1234567\npassword: " + secret + "\n", "p1234567", "", ""},
	{"YAML comments after the values", "username: admin   # the WebUI's\npassword: " + secret + " # set in the WebUI\n", "admin", "", ""},
	{"YAML '' in single quotes", "username: admin\npassword: 'it''s #1'\n", "admin", "it's #1", ""},
	{"YAML null password", "username: admin\npassword: ~\n", "", "", "no password"},
	{"YAML indicator", "username: admin\npassword: @x\n", "", "", "not YAML of the form"},
	{"BOM", "\xef\xbb\xbfusername=admin\npassword=" + secret + "\n", "admin", "", ""},

	// CRLF, as a file edited on Windows has it.
	{"key=value CRLF", "username=admin\r\npassword=" + secret + "\r\n", "admin", "", ""},
	{"two bare lines CRLF", "p1234567\r\n" + secret + "\r\n", "p1234567", "", ""},
	{"YAML CRLF", "username: p1234567\r\npassword: " + secret + "\r\n", "p1234567", "", ""},
	{"a lone CR in a value", "username=admin\npassword=hunter2\rs3cret\n", "", "", "a control character in the password (line 2)"},

	// Missing parts.
	{"empty", "", "", "", "is empty"},
	{"blank", "\n \n", "", "", "is empty"},
	{"key=value without password", "username=admin\n", "", "", "no password= line"},
	{"key=value without username", "password=" + secret + "\n", "", "", "no username= line"},
	{"key=value empty password", "username=admin\npassword=\n", "", "", "the password is empty (line 2)"},
	{"key=value empty username", "username=\npassword=" + secret + "\n", "", "", "the username is empty (line 1)"},
	{"one bare line", "p1234567\n", "", "", "has 1 lines; want 2"},
	{"bare, empty password", "p1234567\n  \n", "", "", "the password is empty (line 2)"},
	{"YAML without password", "username: p1234567\n", "", "", "no password"},
	{"YAML without username", "password: " + secret + "\n", "", "", "no username"},
	{"YAML empty password", "username: p1234567\npassword: \"\"\n", "", "", "the password is empty"},

	// Extra lines and keys.
	{"three bare lines", "p1234567\n" + secret + "\nextra\n", "", "", "has 3 lines; want 2"},
	{"bare lines with a blank between", "p1234567\n\n" + secret + "\n", "", "", "has 3 lines"},
	{"key=value, another key", "username=admin\npassword=" + secret + "\nurl=http://x\n", "", "", "line 3: not a username= or password= line"},
	{"key=value, a bare line", "username=admin\n" + secret + "\n", "", "", "line 2: not a username= or password= line"},
	{"key=value twice", "username=admin\npassword=" + secret + "\npassword=other\n", "", "", "line 3: a second password= (the first is on line 2)"},
	{"key=value spaces", "username = admin\npassword = " + secret + "\n", "", "", "line 1: spaces around username's '='"},
	{"YAML another key", "username: p1234567\npassword: " + secret + "\nregion: nl\n", "", "", "not YAML of the form"},
	{"YAML two documents", "username: p1234567\npassword: " + secret + "\n---\nusername: x\n", "", "", "more than one YAML document"},
	{"YAML broken", "username: [p1234567\npassword: " + secret + "\n", "", "", "not YAML of the form"},

	// Control characters.
	{"NUL in the password", "username=admin\npassword=hunter2\x00\n", "", "", "a control character in the password (line 2)"},
	{"escape in the username", "\x1b[2Jadmin\n" + secret + "\n", "", "", "a control character in the username (line 1)"},
	{"a tab is a character", "username=admin\npassword=hunter2\ts3cret\n", "admin", "hunter2\ts3cret", ""},
}

// TestParse: each spelling of the one format is read, and hostile
// contents are refused with a reason that names the line and quotes
// nothing.
func TestParse(t *testing.T) {
	for _, tt := range parseCases {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.in))
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("%q: %v", tt.in, err)
			case tt.err == "":
				if c.Username != tt.user || c.Password.Value() != tt.wantPass() {
					t.Errorf("%q: user %q, password %q", tt.in, c.Username, c.Password.Value())
				}
			case err == nil:
				t.Fatalf("%q: accepted (%q)", tt.in, c.Username)
			case !strings.Contains(err.Error(), tt.err):
				t.Errorf("%q: error %q, want %q", tt.in, err, tt.err)
			}
			if err != nil {
				for _, s := range []string{"hunter2", "s3cret", "p1234567", "admin", "http://x", "region"} {
					if strings.Contains(err.Error(), s) {
						t.Errorf("%q: the error quotes the file (%q): %v", tt.in, s, err)
					}
				}
			}
		})
	}
}

// TestSecretNeverPrints: the password does not show in any format.
func TestSecretNeverPrints(t *testing.T) {
	c := Creds{Username: "admin", Password: Secret(secret)}
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%v %+v %#v %s %q", c, c, c, c.Password, c.Password)} {
		if strings.Contains(s, "hunter2") {
			t.Errorf("printed: %s", s)
		}
	}
}

// TestRead: the file is opened as every secret is: a link, a file others
// may read, one too big, one not root's, a FIFO are refused, each with a
// reason naming the file and nothing of what it holds.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	good := write("good.cred", "username=admin\npassword="+secret+"\n", 0o600)
	if c, err := Read(good); err != nil || c.Username != "admin" || c.Password.Value() != secret {
		t.Fatalf("Read(good): %+v %v", c, err)
	}
	link := filepath.Join(dir, "link.cred")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.cred")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, path, err string }{
		{"symlink", link, "is a symbolic link, which is not followed here"},
		{"group-readable", write("group.cred", "username=admin\npassword="+secret+"\n", 0o640), "is readable by group or others (mode 0640)"},
		{"world-readable", write("world.cred", "p1234567\n"+secret+"\n", 0o644), "is readable by group or others (mode 0644)"},
		{"over the cap", write("big.cred", "username=admin\npassword="+strings.Repeat("x", MaxSize)+"\n", 0o600), "is too big"},
		{"FIFO", fifo, "not a regular file (a FIFO)"},
		{"missing", filepath.Join(dir, "none.cred"), "does not exist"},
		{"bad content", write("bad.cred", "username=admin\n", 0o600), "bad.cred: no password= line"},
	}
	if os.Geteuid() == 0 {
		p := write("nobody.cred", "username=admin\npassword="+secret+"\n", 0o600)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ name, path, err string }{"not root's", p, "is owned by uid 65534, not root"})
	}
	for _, tt := range cases {
		_, err := Read(tt.path)
		switch {
		case err == nil:
			t.Errorf("%s: read", tt.name)
		case !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), tt.path):
			t.Errorf("%s: %v; want %q naming %s", tt.name, err, tt.err, tt.path)
		case strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "admin"):
			t.Errorf("%s: the error quotes the file: %v", tt.name, err)
		}
	}
}
