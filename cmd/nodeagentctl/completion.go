package main

import (
	"strings"

	"github.com/nodeagent/nodeagent/agent/api"
)

// conditionTypes are the condition types agent/api defines, offered after
// --for=condition/. The daemon may report others; those can be typed.
var conditionTypes = []string{
	api.CondReady,
	api.CondConverged,
	api.CondConfigLoaded,
	api.CondKillSwitchArmed,
	api.CondSafeApply,
	api.CondARPReachable,
	api.CondPeersConfigured,
}

// completions holds the completion script for each shell, by name.
var completions = map[string]string{
	"bash": strings.ReplaceAll(bashCompletion, "@FOR@", strings.Join(forValues(false), " ")),
	"zsh":  strings.ReplaceAll(zshCompletion, "@FORZSH@", strings.Join(forValues(true), " ")),
}

// forValues are the words --for completes to; withStatus adds each
// condition's =STATUS forms (bash completes those as a separate word,
// because it splits at "=").
func forValues(withStatus bool) []string {
	words := []string{"ready", "healthy"}
	for _, c := range conditionTypes {
		words = append(words, "condition/"+c)
		if withStatus {
			for _, s := range []string{api.True, api.False, api.Unknown} {
				words = append(words, "condition/"+c+"="+s)
			}
		}
	}
	return words
}

// bashCompletion is hand-written rather than generated: the command line is
// small, and a script without dependencies (not even bash-completion's
// helpers) works in any bash.
const bashCompletion = `# bash completion for nodeagentctl
# Install: nodeagentctl completion bash > /etc/bash_completion.d/nodeagentctl
# or: source <(nodeagentctl completion bash)

_nodeagentctl() {
    local cur key aftereq cmd w i
    cur="${COMP_WORDS[COMP_CWORD]}"
    key="${COMP_WORDS[COMP_CWORD-1]}"
    aftereq=0
    # bash splits --for=X at the "=" into three words: complete the value
    # after it as if it followed the flag.
    if [[ "$cur" == "=" ]]; then
        cur=""
        aftereq=1
    elif [[ "$key" == "=" && ${COMP_CWORD} -ge 2 ]]; then
        key="${COMP_WORDS[COMP_CWORD-2]}"
        aftereq=1
    fi

    case "$key" in
    -o|--output)
        COMPREPLY=($(compgen -W "table json" -- "$cur"))
        return
        ;;
    --socket)
        COMPREPLY=($(compgen -f -- "$cur"))
        return
        ;;
    --timeout)
        COMPREPLY=($(compgen -W "30s 2m 5m" -- "$cur"))
        return
        ;;
    --for)
        COMPREPLY=($(compgen -W "@FOR@" -- "$cur"))
        return
        ;;
    condition/*)
        # --for=condition/NAME=STATUS
        if [[ $aftereq == 1 ]]; then
            COMPREPLY=($(compgen -W "True False Unknown" -- "$cur"))
            return
        fi
        ;;
    esac

    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in
        status|plan|reload|peers|port|wait|completion|version|help)
            cmd="$w"
            break
            ;;
        esac
    done

    if [[ "$cmd" == "completion" && "$key" == "completion" ]]; then
        COMPREPLY=($(compgen -W "bash zsh" -- "$cur"))
        return
    fi
    if [[ "$cur" == -* ]]; then
        local flags="--socket --help -h"
        [[ -z "$cmd" ]] && flags="$flags --version"
        case "$cmd" in
        status|peers) flags="$flags --output -o" ;;
        wait) flags="$flags --for --timeout" ;;
        esac
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return
    fi
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "status plan reload peers port wait completion version help" -- "$cur"))
    fi
}

complete -F _nodeagentctl nodeagentctl
`

// zshCompletion is the zsh counterpart of bashCompletion.
const zshCompletion = `#compdef nodeagentctl
# zsh completion for nodeagentctl
# Install: nodeagentctl completion zsh > "${fpath[1]}/_nodeagentctl"
# or: source <(nodeagentctl completion zsh)

_nodeagentctl_for() {
    local -a values
    values=(@FORZSH@)
    compadd -a values
}

_nodeagentctl() {
    local curcontext="$curcontext" state line ret=1
    local -a common output waiting commands
    common=(
        '--socket=[the daemon socket]:socket:_files'
        '(- *)'{-h,--help}'[print the usage]'
        '(- *)--version[print the version]'
    )
    output=(
        '(-o --output)'{-o+,--output=}'[output format]:format:(table json)'
    )
    waiting=(
        '--for=[what to wait for]:condition:->for'
        '--timeout=[give up after]:duration:(30s 2m 5m)'
    )
    commands=(
        'status:show the node state'
        'plan:show what a sync would change'
        'reload:re-read the config (root only)'
        'peers:show WireGuard devices and peers'
        'port:print the port PIA forwards'
        'wait:wait until the node is ready or a condition holds'
        'completion:print a shell completion script'
        'version:print the version'
        'help:print the usage'
    )
    # Before the command any flag may come; after it, the command's own.
    _arguments -C $common $output $waiting '1:command:->command' '*::arg:->args' && ret=0
    case $state in
    command)
        _describe -t commands 'nodeagentctl command' commands && ret=0
        ;;
    for)
        _nodeagentctl_for && ret=0
        ;;
    args)
        case $words[1] in
        status|peers) _arguments -C $common $output && ret=0 ;;
        wait) _arguments -C $common $waiting && ret=0 ;;
        completion) _arguments -C $common '1:shell:(bash zsh)' && ret=0 ;;
        *) _arguments -C $common && ret=0 ;;
        esac
        [[ $state == for ]] && _nodeagentctl_for && ret=0
        ;;
    esac
    return ret
}

if [[ "${funcstack[1]}" == "_nodeagentctl" ]]; then
    # Loaded from $fpath by compinit.
    _nodeagentctl "$@"
else
    # Sourced.
    compdef _nodeagentctl nodeagentctl
fi
`
