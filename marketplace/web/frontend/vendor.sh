#!/bin/sh
# Copy the built front-end libraries and their licences into static/web/vendor/, which is
# committed: the server never loads anything from a CDN, and needs no npm at run time.
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --ignore-scripts
out=../static/web/vendor
mkdir -p "$out"
cp node_modules/uplot/dist/uPlot.iife.min.js "$out/uPlot.iife.min.js"
cp node_modules/uplot/dist/uPlot.min.css "$out/uPlot.min.css"
cp node_modules/uplot/LICENSE "$out/uPlot.LICENSE"
