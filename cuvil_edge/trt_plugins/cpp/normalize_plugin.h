// cuvil::normalize_u8 as a TensorRT IPluginV3 (TensorRT >= 10.0): uint8 NHWC frames in,
// float32 NCHW out, (x - mean[c]) / std[c]. The contract is PLUGINS in
// cuvil_edge/trt_plugins/__init__.py; the shape rule mirrors output_shapes() there.
#pragma once

#include "cuvil_kernels.h"

#include <NvInferRuntime.h>

#include <string>
#include <vector>

namespace cuvil {

constexpr char const* kNormalizeName = "normalize_u8";
constexpr char const* kNormalizeVersion = "1";
constexpr char const* kNamespace = "cuvil";

class NormalizeU8Plugin : public nvinfer1::IPluginV3,
                          public nvinfer1::IPluginV3OneCore,
                          public nvinfer1::IPluginV3OneBuild,
                          public nvinfer1::IPluginV3OneRuntime
{
public:
    /// @param[in] mean, std one value per channel (1 to kMaxChannels), std without zeros.
    NormalizeU8Plugin(std::vector<float> mean, std::vector<float> std);

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override { return kNormalizeName; }
    char const* getPluginVersion() const noexcept override { return kNormalizeVersion; }
    char const* getPluginNamespace() const noexcept override { return kNamespace; }

    // IPluginV3OneBuild
    int32_t getNbOutputs() const noexcept override { return 1; }
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                            nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                               nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
                            int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                            nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const*, int32_t, nvinfer1::DynamicPluginTensorDesc const*,
                            int32_t) const noexcept override
    {
        return 0;
    }

    // IPluginV3OneRuntime
    int32_t setTactic(int32_t) noexcept override { return 0; }
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
                          int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
                    void const* const* inputs, void* const* outputs, void* workspace,
                    cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    std::vector<float> mMean;
    std::vector<float> mStd;
    ChannelAffine mAffine{};
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

class NormalizeU8Creator : public nvinfer1::IPluginCreatorV3One
{
public:
    NormalizeU8Creator();
    char const* getPluginName() const noexcept override { return kNormalizeName; }
    char const* getPluginVersion() const noexcept override { return kNormalizeVersion; }
    char const* getPluginNamespace() const noexcept override { return kNamespace; }
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override { return &mFieldCollection; }
    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
                                      nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace cuvil
