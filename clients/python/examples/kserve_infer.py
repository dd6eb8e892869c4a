"""Calls gcmoe's KServe v2 (Open Inference Protocol) front door with the `inference` stubs the
package ships: the model "gcmoe", inputs hidden / topk_ids / topk_weights, parameter layer.

    python clients/python/examples/kserve_infer.py [--addr 127.0.0.1:50051] [--tokens 8]
"""
import argparse

import grpc
import numpy as np
from inference import grpc_predict_v2_pb2 as pb
from inference import grpc_predict_v2_pb2_grpc as pb_grpc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:50051")
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()

    with grpc.insecure_channel(args.addr) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        print("ready:", stub.ServerReady(pb.ServerReadyRequest()).ready)
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="gcmoe"))
        H, k = meta.inputs[0].shape[1], meta.inputs[1].shape[1]
        E = int(meta.properties["experts"])
        rng = np.random.default_rng(0)
        T = args.tokens
        hidden = rng.standard_normal((T, H)).astype(np.float32)
        ids = np.argsort(rng.random((T, E)), axis=1)[:, :k].astype(np.int32)
        weights = np.full((T, k), 1.0 / k, dtype=np.float32)
        request = pb.ModelInferRequest(
            model_name="gcmoe",
            parameters={"layer": pb.InferParameter(int64_param=0),
                        "output_datatype": pb.InferParameter(string_param="FP32")},
            inputs=[pb.ModelInferRequest.InferInputTensor(name="hidden", datatype="FP32",
                                                          shape=hidden.shape),
                    pb.ModelInferRequest.InferInputTensor(name="topk_ids", datatype="INT32",
                                                          shape=ids.shape),
                    pb.ModelInferRequest.InferInputTensor(name="topk_weights", datatype="FP32",
                                                          shape=weights.shape)],
            raw_input_contents=[hidden.tobytes(), ids.tobytes(), weights.tobytes()])
        response = stub.ModelInfer(request)
        out = response.outputs[0]
        y = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(out.shape)
        print(f"{out.name}: {out.datatype} {list(out.shape)}, mean |y| {np.abs(y).mean():.4f}")


if __name__ == "__main__":
    main()
