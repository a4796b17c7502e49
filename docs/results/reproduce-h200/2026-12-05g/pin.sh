# Make .pin (git-ignored) from a tag: the code the report's sittings run, one commit over several sessions
# (reproduce.py --help). bash docs/results/reproduce-h200/2026-12-05g/pin.sh TAG
set -e
tag=${1:?give the tag, e.g. sitting-2026-12-05h}
rm -rf .pin && mkdir .pin
git archive "$tag" engine kforge_tui scripts configs pyproject.toml | tar -x -C .pin
git rev-parse "$tag^{commit}" > .pin/COMMIT
echo ".pin: $(cat .pin/COMMIT) ($tag)"
