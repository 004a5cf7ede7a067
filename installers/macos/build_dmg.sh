#!/usr/bin/env bash
# macOS: GPUFlex.app (from installers/gpuflex.spec) in a drag-to-Applications GPUFlex-VERSION.dmg.
# NOT RUN HERE (no macOS machine): .github/workflows/installers.yml runs it on macos-latest.
#
#   installers/macos/build_dmg.sh                      # ad-hoc signed (local testing only)
#   MACOS_SIGN_IDENTITY="Developer ID Application: ..." NOTARY_PROFILE=gpuflex \
#     installers/macos/build_dmg.sh                    # signed, notarized and stapled
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}

"$PYTHON" -m PyInstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller \
  installers/gpuflex.spec
APP=dist/GPUFlex.app
VERSION=$(cat dist/gpuflex/VERSION)
# what desktop/updater.py reads beside the programs (the spec writes them into dist/gpuflex)
cp dist/gpuflex/VERSION "$APP/Contents/MacOS/"
if [ -d dist/gpuflex/update ]; then cp -R dist/gpuflex/update "$APP/Contents/MacOS/"; fi
"$APP/Contents/MacOS/gpuflex-node" --version

# Signing after every change to the .app (installers/README.md: hardened runtime, no --deep
# on distribution builds if nested code is signed one by one; --deep is enough for ad hoc).
if [ -n "${MACOS_SIGN_IDENTITY:-}" ]; then
  codesign --force --deep --options runtime --timestamp -s "$MACOS_SIGN_IDENTITY" "$APP"
else
  codesign --force --deep -s - "$APP"
fi
codesign --verify --deep --strict "$APP"

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
DMG="dist/GPUFlex-$VERSION.dmg"
rm -f "$DMG"
hdiutil create -volname GPUFlex -srcfolder "$STAGE" -ov -format UDZO "$DMG"

if [ -n "${MACOS_SIGN_IDENTITY:-}" ] && [ -n "${NOTARY_PROFILE:-}" ]; then
  codesign --force --timestamp -s "$MACOS_SIGN_IDENTITY" "$DMG"
  xcrun notarytool submit "$DMG" --keychain-profile "$NOTARY_PROFILE" --wait
  xcrun stapler staple "$DMG"
fi
# the .dmg mounts and holds a runnable app
MNT=$(mktemp -d)
hdiutil attach "$DMG" -mountpoint "$MNT" -nobrowse -quiet
"$MNT/GPUFlex.app/Contents/MacOS/gpuflex-node" --version
hdiutil detach "$MNT" -quiet
echo "$DMG"
