package wg

import (
	"fmt"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
)

// maxKeyFile bounds what is read of a key file: a key is 45 bytes.
const maxKeyFile = 1024

// KeyFileRules are how key files are opened: not through a link, without
// blocking (a FIFO in its place must not wedge the daemon), a regular file
// owned by root that nobody else can read, and small.
var KeyFileRules = fsafe.Rules{MaxSize: maxKeyFile, Private: true, RootOwned: true}

// ReadKeyFile reads a key as wg genkey writes it, under KeyFileRules. No
// error repeats the file's contents.
func ReadKeyFile(path string) (Key, error) {
	b, err := fsafe.ReadFile(path, KeyFileRules)
	if err != nil {
		return Key{}, err
	}
	k, err := ParseKey(strings.TrimSpace(string(b)))
	if err != nil {
		return Key{}, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// ReadPrivateKeyFile reads a private key as ReadKeyFile does, clamped
// (Key.Clamped): as the device will hold it.
func ReadPrivateKeyFile(path string) (Key, error) {
	k, err := ReadKeyFile(path)
	return k.Clamped(), err
}
