#!/bin/sh
# Builds feeder_dump (our reader, beside this script) against Chakra's C++ feeder and schema, from a
# checkout of the mlcommons/chakra repository, into OUT. Nothing of Chakra's is copied into this
# repository: its sources are compiled where the checkout is, the generated schema code goes to OUT.
# Needs: protoc and libprotobuf (Debian: protobuf-compiler libprotobuf-dev), zlib, g++.
set -eu
if [ $# -ne 2 ]; then
  echo "usage: $0 CHAKRA_DIR OUT" >&2
  exit 2
fi
chakra=$(cd "$1" && pwd)
out=$2
here=$(cd "$(dirname "$0")" && pwd)
for f in schema/protobuf/et_def.proto src/feeder/et_feeder.cpp src/third_party/utils/protoio.cc; do
  [ -f "$chakra/$f" ] || { echo "$0: $chakra has no $f; give a checkout of mlcommons/chakra" >&2; exit 2; }
done
mkdir -p "$out"
protoc --proto_path="$chakra/schema/protobuf" --cpp_out="$out" "$chakra/schema/protobuf/et_def.proto"
g++ -std=c++17 -O1 -w -I"$out" -I"$chakra/src/feeder" -I"$chakra/src/third_party/utils" \
  "$here/feeder_dump.cpp" "$chakra/src/feeder/et_feeder.cpp" "$chakra/src/feeder/et_feeder_node.cpp" \
  "$chakra/src/third_party/utils/protoio.cc" "$out/et_def.pb.cc" \
  -lprotobuf -lz -lpthread -o "$out/feeder_dump"
echo "$out/feeder_dump"
