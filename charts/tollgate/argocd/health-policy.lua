-- Argo CD health check for Tollgate's policies (tollgate.dev/v1alpha1): RateLimitPolicy,
-- AuthPolicy, ClientPolicy and CachePolicy, which share one status shape.
-- Install it in argocd-cm under each kind's key (see README.md next to this file):
--   resource.customizations.health.tollgate.dev_RateLimitPolicy
--   resource.customizations.health.tollgate.dev_AuthPolicy
--   resource.customizations.health.tollgate.dev_ClientPolicy
--   resource.customizations.health.tollgate.dev_CachePolicy
-- Lua 5.1 as Argo CD runs it (gopher-lua), base library only.
--
-- Progressing  no status yet; status.observedGeneration differs from metadata.generation
--              (the controller has not seen the last change); no Accepted condition yet;
--              Reconciling=True (accepted, but the Gateway's proxies do not run it yet).
-- Degraded     Accepted=False (TargetNotFound, Invalid, Conflicted) or Stalled=True:
--              "<reason>: <message>" of the condition.
-- Healthy      Accepted=True and nothing above: the policy is as enforced as it can be.
--              Enforced=True, or Enforced=False with reason Overridden (other policies win:
--              the hierarchy doing what it was told) or Unknown without Reconciling (no route
--              is served under the targets yet): the message then says "not in effect".
-- This is kstatus's verdict (Flux): Current = Healthy, InProgress = Progressing,
-- Failed = Degraded, with one difference: kstatus reads "no status yet" as Current.
local hs = {}

local function condition(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function text(c)
  local reason = c.reason or "Unknown"
  if c.message == nil or c.message == "" then
    return reason
  end
  return reason .. ": " .. c.message
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Tollgate controller to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = status.observedGeneration
if observed == nil or observed == 0 then
  -- 0: a schema default standing in for "not observed yet".
  hs.status = "Progressing"
  hs.message = "Waiting for the Tollgate controller to report status"
  return hs
end
if generation ~= nil and observed ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Tollgate controller to observe generation " .. tostring(generation)
    .. " (status is of generation " .. tostring(observed) .. ")"
  return hs
end

local accepted = condition(status.conditions, "Accepted")
local stalled = condition(status.conditions, "Stalled")
if accepted ~= nil and accepted.status == "False" then
  hs.status = "Degraded"
  hs.message = text(accepted)
  return hs
end
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = text(stalled)
  return hs
end
if accepted == nil or accepted.status ~= "True" then
  hs.status = "Progressing"
  hs.message = "Waiting for the Tollgate controller to accept the policy"
  return hs
end

local reconciling = condition(status.conditions, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = text(reconciling)
  return hs
end

local enforced = condition(status.conditions, "Enforced")
hs.status = "Healthy"
hs.message = accepted.message
if hs.message == nil or hs.message == "" then
  hs.message = "Accepted"
end
if enforced ~= nil and enforced.status == "True" then
  if enforced.message ~= nil and enforced.message ~= "" then
    hs.message = hs.message .. "; " .. enforced.message
  end
elseif enforced ~= nil then
  hs.message = hs.message .. "; not in effect (" .. (enforced.reason or "Unknown") .. "): "
    .. (enforced.message or "")
end
return hs
