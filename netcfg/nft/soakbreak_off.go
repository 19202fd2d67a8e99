//go:build !soakbreak

package nft

// soakBreak is the identity: only a soakbreak build breaks the kill
// switch (see soakbreak.go).
func soakBreak(tables []Table, _ map[tableKey]Table) []Table { return tables }
