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
    --expires)
        COMPREPLY=($(compgen -W "1d 7d 30d 90d 365d" -- "$cur"))
        return
        ;;
    --qr-png)
        COMPREPLY=($(compgen -f -- "$cur"))
        return
        ;;
    --device|--ip|--description|--via)
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
        status|plan|reload|peers|peer|port|wait|completion|version|help)
            cmd="$w"
            break
            ;;
        esac
    done
    # peer's action: the word after it.
    local action=""
    if [[ "$cmd" == "peer" ]]; then
        for ((i = i + 1; i < COMP_CWORD; i++)); do
            case "${COMP_WORDS[i]}" in
            add|disable|enable|remove) action="${COMP_WORDS[i]}"; break ;;
            esac
        done
    fi

    if [[ "$cmd" == "completion" && "$key" == "completion" ]]; then
        COMPREPLY=($(compgen -W "bash zsh" -- "$cur"))
        return
    fi
    if [[ "$cmd" == "peer" && -z "$action" && "$cur" != -* ]]; then
        COMPREPLY=($(compgen -W "add disable enable remove" -- "$cur"))
        return
    fi
    if [[ "$cur" == -* ]]; then
        local flags="--socket --help -h"
        [[ -z "$cmd" ]] && flags="$flags --version"
        case "$cmd" in
        status|peers) flags="$flags --output -o" ;;
        wait) flags="$flags --for --timeout" ;;
        peer)
            flags="$flags --device"
            [[ "$action" == add ]] && flags="$flags --ip --description --expires --full-tunnel --via --qr --qr-png"
            ;;
        esac
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return
    fi
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "status plan reload peers peer port wait completion version help" -- "$cur"))
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
    local -a common output waiting peeradd commands
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
    peeradd=(
        '--device=[the WireGuard device]:device:'
        '*--ip=[the client address]:address:'
        '--description=[who or what the client is]:text:'
        '--expires=[when the client leaves the device]:when:(1d 7d 30d 90d 365d)'
        '--full-tunnel[send all its traffic into the tunnel]'
        '--via=[the PIA device its internet leaves by]:device:'
        '--qr[print the config as a QR code]'
        '--qr-png=[write the QR code to a new file]:file:_files'
    )
    commands=(
        'status:show the node state'
        'plan:show what a sync would change'
        'reload:re-read the config (root only)'
        'peers:show WireGuard devices and peers'
        'peer:add, disable, enable or remove a remote-access client'
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
        peer)
            case $words[2] in
            add) _arguments -C $common $peeradd '2:name:' && ret=0 ;;
            disable|enable|remove) _arguments -C $common '--device=[the WireGuard device]:device:' '2:name:' && ret=0 ;;
            *) _arguments -C $common '1:action:(add disable enable remove)' && ret=0 ;;
            esac
            ;;
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
