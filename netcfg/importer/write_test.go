package importer

import (
	"os"
	"path/filepath"
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
