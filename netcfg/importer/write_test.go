package importer

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestWriteOutRefuses: the output directory is a new one, or an empty one
// of this user's: never a link, never another user's (who could swap the
// keys before they are installed).
func TestWriteOutRefuses(t *testing.T) {
	r := Result{Config: []byte("{}\n"), Files: []File{{Path: "keys/wg0.key", Data: []byte("k\n"), Mode: 0o600}}}
	base := t.TempDir()

	target := filepath.Join(base, "target")
	os.Mkdir(target, 0o700)
	link := filepath.Join(base, "link")
	os.Symlink(target, link)
	if err := WriteOut(link, r); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a link: %v", err)
	}

	if os.Geteuid() == 0 {
		theirs := filepath.Join(base, "theirs")
		os.Mkdir(theirs, 0o777)
		os.Chown(theirs, 65534, 65534)
		if err := WriteOut(theirs, r); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("another user's directory: %v", err)
		}
		if entries, _ := os.ReadDir(theirs); len(entries) != 0 {
			t.Errorf("wrote into another user's directory: %v", entries)
		}
	}

	if os.Geteuid() == 0 {
		// Under another user's directory: the whole path is checked, not
		// only the last component.
		theirs := filepath.Join(base, "theirs-parent")
		os.Mkdir(theirs, 0o755)
		os.Chown(theirs, 65534, 65534)
		if err := WriteOut(filepath.Join(theirs, "out"), r); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("under another user's directory: %v", err)
		}
		// Through another user's link to a directory of root's.
		link := filepath.Join(base, "theirs-link")
		os.Symlink(target, link)
		os.Lchown(link, 65534, 65534)
		if err := WriteOut(filepath.Join(link, "out"), r); err == nil || !strings.Contains(err.Error(), "is a link of uid 65534") {
			t.Errorf("through another user's link: %v", err)
		}
	}
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if err := WriteOut(filepath.Join(open, "out"), r); err == nil || !strings.Contains(err.Error(), "is writable by others") {
		t.Errorf("under a directory others can write: %v", err)
	}
	// A failure half-way leaves nothing behind.
	bad := r
	bad.Files = append(bad.Files, bad.Files[0])
	if err := WriteOut(filepath.Join(base, "half"), bad); err == nil {
		t.Errorf("a file written twice was taken")
	}
	if entries, _ := os.ReadDir(base); slices.ContainsFunc(entries, func(e fs.DirEntry) bool { return strings.Contains(e.Name(), "half") }) {
		t.Errorf("a failed write left %v", entries)
	}

	mine := filepath.Join(base, "new")
	if err := WriteOut(mine, r); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(mine, "keys/wg0.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key: %v %v", st, err)
	}
	if err := WriteOut(mine, r); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("a second write: %v", err)
	}
}

// TestSecretsOnlyInTheNotesFile: a hook with a token in its URL reaches
// only the notes file, which is 0600; no 0644 file under the output
// directory, no note and no step quotes it.
func TestSecretsOnlyInTheNotesFile(t *testing.T) {
	s, o := loadCase(t, "testdata/kernel-devices")
	r, err := Build(s, o)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "out")
	if err := WriteOut(dir, r); err != nil {
		t.Fatal(err)
	}
	const secret = "s3cr3t"
	found := false
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		st, _ := os.Stat(p)
		if strings.Contains(string(b), secret) {
			found = true
			if st.Mode().Perm() != 0o600 {
				t.Errorf("%s (%v) holds the secret", p, st.Mode().Perm())
			}
		}
		return nil
	})
	if !found {
		t.Errorf("the notes file does not keep the hook line")
	}
	for _, l := range append(r.Notes, r.Steps...) {
		if strings.Contains(l, secret) {
			t.Errorf("printed: %s", l)
		}
	}
}
