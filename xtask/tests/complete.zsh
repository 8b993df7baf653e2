# zsh -f complete.zsh COMPDIR OUT LINE...: what zsh's completion offers after each LINE, as in
# an interactive shell (a pseudo-terminal, TAB at the end of the line): into OUT, a line
# `== LINE` and then the candidates, one a line.
zmodload zsh/zpty || exit 3
compdir=$1 out=$2
shift 2
zpty -b z zsh -f -i
zpty -w z "PS1='' RPS1=''; fpath=($compdir \$fpath); autoload -Uz compinit && compinit -u -D"
zpty -w z "setopt no_beep; unsetopt auto_list auto_menu list_ambiguous"
# every match added is written to OUT as well
zpty -w z "compadd() { if (( \${@[(I)-[OAD]]} )); then builtin compadd \"\$@\"; return; fi; local -a m; builtin compadd -O m \"\$@\"; print -rl -- \$m >> $out; builtin compadd \"\$@\"; }"
# a first completion, not recorded: the first TAB of a new shell is read before its line editor
# has started completing
zpty -w -n z $':\t\x15'
zpty -w z "print DO''NE0"
zpty -r z reply "*DONE0*" || exit 4
: > $out
n=0
for line in "$@"; do
    n=$((n + 1))
    zpty -w z "print -r -- ${(q)line:+== $line} >> $out"
    zpty -w -n z "$line"$'\t'$'\x15'
    # the shell prints this once the completion is done (the echo of the line reads DO''NE)
    zpty -w z "print DO''NE$n"
    zpty -r z reply "*DONE$n*" || exit 4
done
zpty -w z exit
zpty -d z
