#include "server/kserve_request.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

namespace gcmoe::server {
namespace {

using inference::InferParameter;
using inference::InferTensorContents;
using inference::ModelInferRequest;

struct InputSpec {
  const char* name;
  std::vector<gcmoe::v1::DType> dtypes;  // accepted, the first one named first in messages
  const char* expected;                  // shape and datatype, for "missing" messages
};

const std::vector<InputSpec>& Inputs() {
  static const std::vector<InputSpec> inputs = {
      {"hidden", {gcmoe::v1::BF16, gcmoe::v1::FP32}, "[T, H] BF16 or FP32"},
      {"topk_ids", {gcmoe::v1::INT32}, "[T, k] INT32"},
      {"topk_weights", {gcmoe::v1::FP32}, "[T, k] FP32"},
  };
  return inputs;
}

// The protocol's datatype strings for the dtypes the API carries.
bool ParseDatatype(const std::string& text, gcmoe::v1::DType* dtype) {
  static const std::map<std::string, gcmoe::v1::DType> names = {
      {"BF16", gcmoe::v1::BF16}, {"FP32", gcmoe::v1::FP32}, {"INT32", gcmoe::v1::INT32}};
  const auto it = names.find(text);
  if (it == names.end()) return false;
  *dtype = it->second;
  return true;
}

const char* DatatypeText(gcmoe::v1::DType dtype) {
  switch (dtype) {
    case gcmoe::v1::BF16:
      return "BF16";
    case gcmoe::v1::FP32:
      return "FP32";
    case gcmoe::v1::INT32:
      return "INT32";
    default:
      return "UNSUPPORTED";
  }
}

int ElementBytes(gcmoe::v1::DType dtype) { return dtype == gcmoe::v1::BF16 ? 2 : 4; }

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::string s = "[";
  for (int i = 0; i < shape.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

std::string InputName(const std::string& name) { return "input " + Quoted(name); }

// How many typed content fields of any kind an input carries.
int64_t ContentCount(const InferTensorContents& c) {
  return c.bool_contents_size() + c.int_contents_size() + c.int64_contents_size() +
         c.uint_contents_size() + c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

// Elements in a shape; an error for a negative dimension or one that overflows.
Status ElementCount(const std::string& input, const google::protobuf::RepeatedField<int64_t>& shape,
                    int64_t* count) {
  int64_t n = 1;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return InvalidArgument(InputName(input) + ": shape " + ShapeText(shape) +
                             " has a negative dimension");
    }
    if (shape[i] > 0 && n > (int64_t{1} << 40) / shape[i]) {
      return InvalidArgument(InputName(input) + ": shape " + ShapeText(shape) +
                             " is larger than any request the service accepts");
    }
    n *= shape[i];
  }
  *count = n;
  return Status::Ok();
}

// Typed contents as little-endian bytes (the hosts gcmoe runs on are little-endian, as the
// API's tensors are).
Status ContentsToBytes(const std::string& input, gcmoe::v1::DType dtype, int64_t count,
                       const InferTensorContents& contents, std::string* data) {
  const char* field = dtype == gcmoe::v1::INT32 ? "int_contents" : "fp32_contents";
  if (dtype == gcmoe::v1::BF16) {
    return InvalidArgument(InputName(input) +
                           ": BF16 has no typed contents in the protocol, expected its bytes in "
                           "raw_input_contents");
  }
  const int64_t given =
      dtype == gcmoe::v1::INT32 ? contents.int_contents_size() : contents.fp32_contents_size();
  if (given != ContentCount(contents)) {
    return InvalidArgument(InputName(input) + ": " + DatatypeText(dtype) +
                           " values belong in contents." + field + ", other fields are set");
  }
  if (given != count) {
    return InvalidArgument(InputName(input) + ": contents." + field + " has " +
                           std::to_string(given) + " values, the shape needs " +
                           std::to_string(count));
  }
  data->resize(static_cast<size_t>(count) * 4);
  if (count == 0) return Status::Ok();
  const void* source = dtype == gcmoe::v1::INT32
                           ? static_cast<const void*>(contents.int_contents().data())
                           : static_cast<const void*>(contents.fp32_contents().data());
  std::memcpy(data->data(), source, data->size());
  return Status::Ok();
}

Status ApplyParameters(const ModelInferRequest& request, gcmoe::v1::ForwardRequest* forward) {
  // std::map: the first unknown parameter reported is the same on every call.
  const std::map<std::string, InferParameter> parameters(request.parameters().begin(),
                                                         request.parameters().end());
  for (const auto& [key, value] : parameters) {
    const std::string field = "parameters[" + Quoted(key) + "]";
    if (key == "layer") {
      int64_t layer = -1;
      if (value.parameter_choice_case() == InferParameter::kInt64Param) {
        layer = value.int64_param();
      } else if (value.parameter_choice_case() == InferParameter::kUint64Param &&
                 value.uint64_param() <= UINT32_MAX) {
        layer = static_cast<int64_t>(value.uint64_param());
      }
      if (layer < 0 || layer > UINT32_MAX) {
        return InvalidArgument(field +
                               ": expected the MoE layer index as a non-negative "
                               "int64_param");
      }
      forward->set_layer(static_cast<uint32_t>(layer));
    } else if (key == "output_datatype") {
      const std::string text = value.parameter_choice_case() == InferParameter::kStringParam
                                   ? value.string_param()
                                   : std::string();
      if (text == "BF16") {
        forward->set_output_dtype(gcmoe::v1::BF16);
      } else if (text == "FP32") {
        forward->set_output_dtype(gcmoe::v1::FP32);
      } else {
        return InvalidArgument(field + ": " + Quoted(text) +
                               ", expected string_param 'BF16' or 'FP32'");
      }
    } else {
      return InvalidArgument(field +
                             ": unknown parameter, expected 'layer' or "
                             "'output_datatype'");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckKServeModel(const std::string& field, const std::string& name,
                        const std::string* version) {
  if (name != kKServeModelName) {
    return NotFound(field + ": " + Quoted(name) + " is not a served model, expected " +
                    Quoted(kKServeModelName));
  }
  if (version != nullptr && !version->empty() && *version != kKServeModelVersion) {
    return NotFound("version " + Quoted(*version) + " of model " + Quoted(name) +
                    " is not served, expected " + Quoted(kKServeModelVersion) + " or none");
  }
  return Status::Ok();
}

Status ToForwardRequest(const ModelInferRequest& request, gcmoe::v1::ForwardRequest* forward) {
  GCMOE_RETURN_IF_ERROR(
      CheckKServeModel("model_name", request.model_name(),
                       request.has_model_version() ? &request.model_version() : nullptr));
  forward->set_output_dtype(gcmoe::v1::BF16);
  GCMOE_RETURN_IF_ERROR(ApplyParameters(request, forward));
  for (int i = 0; i < request.outputs_size(); ++i) {
    const auto& output = request.outputs(i);
    if (output.name() != "output") {
      return InvalidArgument("outputs[" + std::to_string(i) + "]: " + Quoted(output.name()) +
                             " is not an output of the model, expected 'output'");
    }
    if (!output.parameters().empty()) {
      return InvalidArgument("output 'output': unknown parameter " +
                             Quoted(output.parameters().begin()->first) + ", expected none");
    }
  }

  const bool raw = request.raw_input_contents_size() > 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size()) {
    return InvalidArgument(
        "raw_input_contents: " + std::to_string(request.raw_input_contents_size()) +
        " entries, expected one per input (" + std::to_string(request.inputs_size()) + ")");
  }
  std::vector<bool> seen(Inputs().size(), false);
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    size_t which = 0;
    while (which < Inputs().size() && input.name() != Inputs()[which].name) ++which;
    if (which == Inputs().size()) {
      return InvalidArgument("inputs[" + std::to_string(i) + "]: " + Quoted(input.name()) +
                             " is not an input of the model, expected 'hidden', 'topk_ids' "
                             "and 'topk_weights'");
    }
    const InputSpec& spec = Inputs()[which];
    if (seen[which]) return InvalidArgument(InputName(spec.name) + ": given twice");
    seen[which] = true;
    if (!input.parameters().empty()) {
      return InvalidArgument(InputName(spec.name) + ": unknown parameter " +
                             Quoted(input.parameters().begin()->first) + ", expected none");
    }
    gcmoe::v1::DType dtype = gcmoe::v1::DTYPE_UNSPECIFIED;
    if (!ParseDatatype(input.datatype(), &dtype) ||
        std::find(spec.dtypes.begin(), spec.dtypes.end(), dtype) == spec.dtypes.end()) {
      std::string expected;
      for (size_t d = 0; d < spec.dtypes.size(); ++d) {
        expected += (d > 0 ? " or " : "") + std::string(DatatypeText(spec.dtypes[d]));
      }
      return InvalidArgument(InputName(spec.name) + ": datatype " + Quoted(input.datatype()) +
                             ", expected " + expected);
    }
    int64_t count = 0;
    GCMOE_RETURN_IF_ERROR(ElementCount(spec.name, input.shape(), &count));

    gcmoe::v1::Tensor* tensor = spec.name == std::string("hidden") ? forward->mutable_hidden()
                                : spec.name == std::string("topk_ids")
                                    ? forward->mutable_topk_ids()
                                    : forward->mutable_topk_weights();
    tensor->set_dtype(dtype);
    tensor->mutable_shape()->CopyFrom(input.shape());
    if (raw) {
      if (input.has_contents() && ContentCount(input.contents()) > 0) {
        return InvalidArgument(InputName(spec.name) + ": has contents and raw_input_contents[" +
                               std::to_string(i) + "], expected only one of them");
      }
      const std::string& bytes = request.raw_input_contents(i);
      const int64_t expected = count * ElementBytes(dtype);
      if (static_cast<int64_t>(bytes.size()) != expected) {
        return InvalidArgument(InputName(spec.name) + ": shape " + ShapeText(input.shape()) +
                               " of " + DatatypeText(dtype) + " needs " + std::to_string(expected) +
                               " bytes, raw_input_contents[" + std::to_string(i) + "] has " +
                               std::to_string(bytes.size()));
      }
      tensor->set_data(bytes);
    } else {
      GCMOE_RETURN_IF_ERROR(
          ContentsToBytes(spec.name, dtype, count, input.contents(), tensor->mutable_data()));
    }
  }
  for (size_t which = 0; which < Inputs().size(); ++which) {
    if (!seen[which]) {
      return InvalidArgument(InputName(Inputs()[which].name) + ": missing, expected " +
                             Inputs()[which].expected);
    }
  }
  forward->set_request_id(request.id());
  return Status::Ok();
}

void ToInferResponse(const ModelInferRequest& request, const gcmoe::v1::ForwardResponse& forward,
                     inference::ModelInferResponse* response) {
  response->set_model_name(kKServeModelName);
  response->set_model_version(kKServeModelVersion);
  response->set_id(request.id());
  auto* output = response->add_outputs();
  output->set_name("output");
  output->set_datatype(DatatypeText(forward.output().dtype()));
  output->mutable_shape()->CopyFrom(forward.output().shape());
  response->add_raw_output_contents(forward.output().data());
}

}  // namespace gcmoe::server
