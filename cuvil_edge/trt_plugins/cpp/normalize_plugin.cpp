// cuvil::normalize_u8 IPluginV3 (see normalize_plugin.h). Written against the TensorRT 10 C++
// API reference (IPluginV3, IPluginV3OneCore/Build/Runtime, IPluginCreatorV3One); it is built on
// a device or against a device sysroot with TensorRT headers (README.md), not on the
// development machine.
#include "normalize_plugin.h"

#include <cstring>
#include <exception>

using namespace nvinfer1;

namespace cuvil {

namespace {
// Errors inside noexcept methods become a -1 status; TensorRT then reports the failing plugin.
constexpr int32_t kFail = -1;

bool validAttrs(std::vector<float> const& mean, std::vector<float> const& std)
{
    if (mean.empty() || mean.size() > static_cast<size_t>(kMaxChannels) || mean.size() != std.size())
        return false;
    for (float s : std)
        if (s == 0.0f)
            return false;
    return true;
}
} // namespace

NormalizeU8Plugin::NormalizeU8Plugin(std::vector<float> mean, std::vector<float> std)
    : mMean(std::move(mean))
    , mStd(std::move(std))
{
    for (size_t i = 0; i < mMean.size() && i < static_cast<size_t>(kMaxChannels); ++i)
    {
        mAffine.mean[i] = mMean[i];
        mAffine.inv_std[i] = 1.0f / mStd[i];
    }
}

IPluginCapability* NormalizeU8Plugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    }
    return nullptr;
}

IPluginV3* NormalizeU8Plugin::clone() noexcept
{
    try
    {
        return new NormalizeU8Plugin(mMean, mStd);
    }
    catch (std::exception const&)
    {
        return nullptr;
    }
}

int32_t NormalizeU8Plugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                           DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || in[0].desc.dims.nbDims != 4 || out[0].desc.dims.nbDims != 4)
        return kFail;
    int64_t const c = in[0].desc.dims.d[3];
    // -1: the channel count is dynamic; enqueue checks the runtime value.
    if (c != -1 && c != static_cast<int64_t>(mMean.size()))
        return kFail;
    return 0;
}

int32_t NormalizeU8Plugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || inputTypes[0] != DataType::kUINT8)
        return kFail;
    outputTypes[0] = DataType::kFLOAT;
    return 0;
}

int32_t NormalizeU8Plugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const*, int32_t,
                                           DimsExprs* outputs, int32_t nbOutputs, IExprBuilder&) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || inputs[0].nbDims != 4)
        return kFail;
    // [N, H, W, C] -> [N, C, H, W]
    outputs[0].nbDims = 4;
    outputs[0].d[0] = inputs[0].d[0];
    outputs[0].d[1] = inputs[0].d[3];
    outputs[0].d[2] = inputs[0].d[1];
    outputs[0].d[3] = inputs[0].d[2];
    return 0;
}

bool NormalizeU8Plugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || pos < 0 || pos > 1)
        return false;
    PluginTensorDesc const& d = inOut[pos].desc;
    if (d.format != TensorFormat::kLINEAR)
        return false;
    return pos == 0 ? d.type == DataType::kUINT8 : d.type == DataType::kFLOAT;
}

int32_t NormalizeU8Plugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const*, int32_t nbOutputs) noexcept
{
    if (nbInputs != 1 || nbOutputs != 1 || in[0].dims.nbDims != 4)
        return kFail;
    return in[0].dims.d[3] == static_cast<int64_t>(mMean.size()) ? 0 : kFail;
}

int32_t NormalizeU8Plugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const*,
                                   void const* const* inputs, void* const* outputs, void*, cudaStream_t stream) noexcept
{
    Dims const& d = inputDesc[0].dims;
    cudaError_t const err = launchNormalizeU8(static_cast<uint8_t const*>(inputs[0]), static_cast<float*>(outputs[0]),
                                              d.d[0], d.d[1], d.d[2], static_cast<int32_t>(d.d[3]), mAffine, stream);
    return err == cudaSuccess ? 0 : kFail;
}

IPluginV3* NormalizeU8Plugin::attachToContext(IPluginResourceContext*) noexcept
{
    return clone();
}

PluginFieldCollection const* NormalizeU8Plugin::getFieldsToSerialize() noexcept
{
    mFields.clear();
    mFields.emplace_back("mean", mMean.data(), PluginFieldType::kFLOAT32, static_cast<int32_t>(mMean.size()));
    mFields.emplace_back("std", mStd.data(), PluginFieldType::kFLOAT32, static_cast<int32_t>(mStd.size()));
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
    return &mFieldCollection;
}

NormalizeU8Creator::NormalizeU8Creator()
{
    mFields.emplace_back("mean", nullptr, PluginFieldType::kFLOAT32, 0);
    mFields.emplace_back("std", nullptr, PluginFieldType::kFLOAT32, 0);
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

IPluginV3* NormalizeU8Creator::createPlugin(char const*, PluginFieldCollection const* fc, TensorRTPhase) noexcept
{
    try
    {
        std::vector<float> mean;
        std::vector<float> std;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
        {
            PluginField const& f = fc->fields[i];
            if (f.type != PluginFieldType::kFLOAT32 || f.data == nullptr)
                continue;
            auto const* v = static_cast<float const*>(f.data);
            if (std::strcmp(f.name, "mean") == 0)
                mean.assign(v, v + f.length);
            else if (std::strcmp(f.name, "std") == 0)
                std.assign(v, v + f.length);
        }
        if (!validAttrs(mean, std))
            return nullptr;
        return new NormalizeU8Plugin(std::move(mean), std::move(std));
    }
    catch (std::exception const&)
    {
        return nullptr;
    }
}

} // namespace cuvil
