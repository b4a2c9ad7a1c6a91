// Reads one Chakra trace with Chakra's own C++ feeder (src/feeder of the mlcommons/chakra repository)
// and prints every node as the feeder sees it, one JSON object per line, in the order the feeder
// makes nodes issuable when each issued node completes at once.
//
// Why: our export must be read by the code that ASTRA-sim's workload layer is built on, not only by
// protobuf. The feeder takes each attribute from one typed field (comm_src from int32_val, ...) and
// runs a node only when its data dependencies have run; a value in another field reads as 0, and a
// dependency on a node the file lacks leaves nodes that never become issuable (exit 1 here).
//
// Build: benchmarks/astra/build_feeder_dump.sh CHAKRA_DIR OUT (needs protoc, libprotobuf, zlib).

#include <iostream>
#include <string>

#include "et_feeder.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: feeder_dump TRACE.et" << std::endl;
    return 2;
  }
  Chakra::ETFeeder feeder(argv[1]);
  while (feeder.hasNodesToIssue()) {
    std::shared_ptr<Chakra::ETFeederNode> node = feeder.getNextIssuableNode();
    if (node == nullptr) {
      std::cerr << argv[1] << ": nodes left whose dependencies never resolve" << std::endl;
      return 1;
    }
    const auto type = static_cast<int>(node->type());
    std::cout << "{\"id\": " << node->id() << ", \"name\": \"" << node->name() << "\", \"type\": " << type
              << ", \"runtime_us\": " << node->runtime() << ", \"is_cpu_op\": " << node->is_cpu_op();
    if (type >= ChakraProtoMsg::COMM_SEND_NODE) {
      std::cout << ", \"comm_size\": " << node->comm_size() << ", \"comm_tag\": " << node->comm_tag();
    }
    if (type == ChakraProtoMsg::COMM_COLL_NODE) {
      std::cout << ", \"comm_type\": " << static_cast<int>(node->comm_type()) << ", \"pg_name\": \""
                << node->pg_name() << "\"";
    } else if (type == ChakraProtoMsg::COMM_SEND_NODE || type == ChakraProtoMsg::COMM_RECV_NODE) {
      std::cout << ", \"comm_src\": " << node->comm_src() << ", \"comm_dst\": " << node->comm_dst();
    }
    std::cout << "}\n";
    feeder.freeChildrenNodes(node->id());
    feeder.removeNode(node->id());
  }
  return 0;
}
