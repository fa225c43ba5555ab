# Prints a Prometheus rule file without the rules' `annotations:` blocks (used by test.sh:
# promtool 2.x compares annotations in every alert test, and the behaviour tests only care
# about expressions, `for:` and labels; tests/annotations/ checks the rendered text).
{
  if (skipping) {
    if ($0 ~ /^[[:space:]]*$/) { next }
    match($0, /^ */)
    if (RLENGTH > indent) { next }
    skipping = 0
  }
  if ($0 ~ /^ *annotations:[[:space:]]*$/) {
    match($0, /^ */)
    indent = RLENGTH
    skipping = 1
    next
  }
  print
}
