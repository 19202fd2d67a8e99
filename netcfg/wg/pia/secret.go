package pia

import "github.com/nodeagent/nodeagent/netcfg/cred"

// Secret is a token or a password: it never prints in any format, so one
// that ends up in an error, a log line or a %+v dump shows nothing.
type Secret = cred.Secret

// Creds are a PIA account's username and password.
type Creds = cred.Creds

// ReadCreds reads a credentials file in the one format nodeagent reads
// every such file in (netcfg/cred): username= and password= lines, two
// bare lines (username, then password), or YAML {username: ...,
// password: ...}. No error quotes the file.
func ReadCreds(path string) (Creds, error) { return cred.Read(path) }
